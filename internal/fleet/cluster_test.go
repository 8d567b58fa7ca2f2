package fleet

import "testing"

// TestParseClusterNodes: primaries, replicas, the failed one and slot counts, from the
// output of a Cluster after a failover.
func TestParseClusterNodes(t *testing.T) {
	out := `07c37dfeb235213a872192d90877d0cd55635b91 127.0.0.1:30004@31004 slave e7d1eecce10fd6bb5eb35b9f99a514335d9ba9ca 0 1426238317239 4 connected
67ed2db8d677e59ec4a4cefb06858cf2a1a89fa1 127.0.0.1:30002@31002 master - 0 1426238316232 2 connected 5461-10922
292f8b365bb7edb5e285caf0b7e6ddc7265d2f4f 127.0.0.1:30003@31003 master - 0 1426238318243 3 connected 10923-16383
6ec23923021cf3ffec47632106199cb7f496ce01 127.0.0.1:30005@31005 master,fail - 1426238316232 1426238315231 5 disconnected
e7d1eecce10fd6bb5eb35b9f99a514335d9ba9ca 127.0.0.1:30001@31001 myself,master - 0 0 1 connected 0-5460 [93-<-292f8b365bb7edb5e285caf0b7e6ddc7265d2f4f]
`
	got := parseClusterNodes(out)
	if len(got) != 5 {
		t.Fatalf("%d servers, want 5: %+v", len(got), got)
	}
	want := []RedisServer{
		{Addr: "127.0.0.1:30004", ID: "07c37dfeb235213a872192d90877d0cd55635b91", PrimaryID: "e7d1eecce10fd6bb5eb35b9f99a514335d9ba9ca"},
		{Addr: "127.0.0.1:30002", ID: "67ed2db8d677e59ec4a4cefb06858cf2a1a89fa1", Primary: true, Slots: 5462},
		{Addr: "127.0.0.1:30003", ID: "292f8b365bb7edb5e285caf0b7e6ddc7265d2f4f", Primary: true, Slots: 5461},
		{Addr: "127.0.0.1:30005", ID: "6ec23923021cf3ffec47632106199cb7f496ce01", Primary: true, Failed: true},
		{Addr: "127.0.0.1:30001", ID: "e7d1eecce10fd6bb5eb35b9f99a514335d9ba9ca", Primary: true, Slots: 5461},
	}
	for i := range want {
		if got[i] != want[i] {
			t.Errorf("server %d: %+v, want %+v", i, got[i], want[i])
		}
	}
}
