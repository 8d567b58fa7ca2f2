// Package node is `wb node`, and the node that `wb serve` embeds: it runs the guests of the
// sessions placed on it through a hypervisor.Driver and owns what happens to them there.
//
//   - Provisioning: a booted guest from a warm pool (Config.Pools) when one fits, else a cold
//     start or a restore from a snapshot; the session runs once its agent answers. A runner
//     pool's guests are direct where the driver can launch them (runsc): the runtime's loader
//     is their init, with no agent, for their run's one exec (direct.go).
//   - Timers: idle and lifetime stops, their warnings and the pause limit fire on the node,
//     so a control-plane outage cannot extend them. Each guest is journaled under
//     DataDir/journal; transitions Redis missed are replayed when it answers again, and a
//     restarted node takes its guests back from the journal and reaps any guest that no entry
//     owns (the data dir is its own: cmd/wb locks it).
//   - Guest events: an OOM kill fails the session with oom, any other death with guest_crash;
//     a sandbox near its host process limit has its guest's agent end the guest's processes
//     (an agent that cannot is not asked again: the sandbox dies should it reach its limit);
//     execs, process starts, egress and resource samples go to the runtime decision point
//     (Config.Runtime), whose kill stops the session. A guest's only way out is the node's
//     egress proxy, which dials through Config.Egress.
//   - Usage: CPU and memory from the guest's cgroup and egress bytes, sent as usage records
//     every Config.Flush and at each state change; heartbeats keep the node registered.
//   - Pause, resume, snapshots (files under DataDir/snapshots; with Config.Snapshots, uploaded
//     to that object store before a snapshot is answered taken, and fetched from it by a
//     restore that lacks them, DataDir/snapshots then being a bounded cache) and stop. A
//     memory snapshot is answered once its checkpoint is written; the guest it stopped is
//     restored after, and calls on the session wait for it. A stop may save the guest first
//     (StopSaving, a desktop's sleep): the checkpoint ends it, with no restore.
//   - The node API (Handler): provisioning and the guest controls for the control plane, and a
//     proxy to each guest's agent (exec, files, PTY). node/client is the control plane's side.
//   - Local: the guests for in-process callers, answering as node/client does; cmd/wb hands it
//     to the gateway's data-path handlers, which the node serves to the edge.
package node
