// Command wb-agent is `wb agent` alone: the static binary that runs inside every guest. It
// holds only the agent's code (no gateway, policies, plugins or Redis client), so a guest
// gets less to attack and it builds in a fraction of wb's time. Its first argument is
// "agent", as for wb, so the node starts either binary the same way.
package main
