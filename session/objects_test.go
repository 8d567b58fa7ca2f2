package session

import (
	"encoding/json"
	"testing"
)

// A list is never {"data": null}, and its last page says so with "next_cursor": null.
func TestNewList(t *testing.T) {
	for _, c := range []struct {
		name string
		list List[Snapshot]
		want string
	}{
		{"nil data, last page", NewList[Snapshot](nil, ""), `{"object":"list","data":[],"next_cursor":null}`},
		{"a page with a next one", NewList([]Snapshot{{ID: "snap_1"}}, "snap_1"),
			`{"object":"list","data":[{"id":"snap_1","object":"","session_id":"","include_memory":false,"state":"","size_bytes":0,"created_at":"0001-01-01T00:00:00.000Z","template":"","tier":0}],"next_cursor":"snap_1"}`},
	} {
		b, err := json.Marshal(c.list)
		if err != nil {
			t.Fatal(err)
		}
		if string(b) != c.want {
			t.Errorf("%s:\n got %s\nwant %s", c.name, b, c.want)
		}
	}
}
