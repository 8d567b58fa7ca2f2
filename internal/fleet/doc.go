// Package fleet starts a whole wb fleet on one machine, on loopback: a Redis Cluster of three
// primaries and three replicas (redis-server and redis-cli --cluster create), three `wb node`s
// each with a data directory of its own, and two gateways (`wb serve --runtime none`) that
// share the Cluster, the API key and the node token. Snapshots go to a file:// object store in
// the fleet's directory, which every node on this machine reaches, so that a session restored
// from a snapshot may land on any node (a fleet of several machines would give the nodes an
// s3:// store instead). `wb fleet` (make fleet) and the chaos tests (conformance/chaos) use it.
//
// Stop ends everything it started and leaves nothing behind: the processes, every guest of
// every node (also those of a node killed with SIGKILL), their mounts and cgroups, and the
// directory.
package fleet
