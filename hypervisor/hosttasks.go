package hypervisor

import "context"

// HostTasker is a Driver whose guests share one process total with every other guest on the
// host, every node's (hypervisor/oci: the pids.max of Options.GuestsCgroup): when they hold
// all of it, any guest's next process fails, and a runsc sandbox dies at its next exec. The
// node reads the total at each of its ticks and, near it, has the guest of its own that holds
// the most give way (see node's hostTasks).
type HostTasker interface {
	// GuestsTotal answers the host tasks the host's guests hold together and their limit
	// (limit <= 0: none). Cheap: the node calls it every tick.
	GuestsTotal() (cur, limit int64, err error)
	// GuestsTasks answers each guest on the host that holds a task, every node's, with its
	// count; the driver's own are marked Own and named by their guest id.
	GuestsTasks(ctx context.Context) ([]GuestTasks, error)
	// GuestTasks answers the host tasks guest id holds (an error: it holds none, it is gone).
	GuestTasks(ctx context.Context, id string) (int64, error)
}

// GuestTasks is one guest's count of host tasks.
type GuestTasks struct {
	ID    string // the guest's id where Own; else where its cgroup is, for the log
	Own   bool   // a guest of this driver (this node's)
	Tasks int64
}
