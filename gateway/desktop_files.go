package gateway

import (
	"context"
	"net/http"

	"wb/desktop"
	"wb/store"
)

// A desktop's files are its session's (API.md: "files as for sessions"): the same three
// routes under /v1/desktops/{id}/files, served by the sessions' handlers once the desktop
// runs. Sending (PUT) and deleting a file is a use: it wakes an asleep desktop and keeps it
// awake. Reading a file or listing a directory is no use (seed 001: "listing sessions or
// files" does not keep a desktop awake), so it never wakes one: an asleep desktop answers
// 409 saying how to wake it. A read that woke it would let anything that polls a desktop's
// files (a file browser, a sync tool) hold it awake, which is what the seed rules out; and
// the files of a sleeping desktop are in its snapshot, with no guest to read them from.

// desktopUseRoutes mounts the routes that use a desktop's guest: its files and its MCP
// endpoint (desktop_mcp.go).
func (s *Server) desktopUseRoutes(api func(pattern string, h handler)) {
	// Capped before a wake: a call past the cap wakes nothing.
	api("GET /v1/desktops/{id}/files", s.desktopFileCall(s.desktopFiles(s.getFile, "")))
	api("PUT /v1/desktops/{id}/files", s.desktopFileCall(s.desktopFiles(s.putFile, desktop.File)))
	api("DELETE /v1/desktops/{id}/files", s.desktopFileCall(s.desktopFiles(s.deleteFile, desktop.File)))
	mcpEndpoint := newDesktopMCP(s)
	// A tool's result may be megabytes (read_file's, screenshot's): the writes to a caller that
	// takes none of it are bounded, as a file's read is.
	api("POST /v1/desktops/{id}/mcp", s.stallBounded(mcpEndpoint.serve))
	api("GET /v1/desktops/{id}/mcp", mcpEndpoint.serve) // 405: no standalone stream
}

// desktopFiles serves a desktop's file route with the session's handler h, once the desktop
// runs (useDesktop with cause: desktop.File wakes it, "" does not). A call with a cause is
// a use from its start (useDesktop records it) to its end.
func (s *Server) desktopFiles(h handler, cause desktop.Cause) handler {
	return func(w http.ResponseWriter, r *http.Request, p store.Project) error {
		if _, err := filePath(r); err != nil {
			return err // a bad request wakes nothing
		}
		id := r.PathValue("id")
		sess, err := s.useDesktop(r.Context(), p, id, cause)
		if err != nil {
			return err
		}
		if cause != "" {
			defer s.touchDesktop(r, p, id)
		}
		// The session's handlers find the session by the path's id.
		r.SetPathValue("id", sess.ID)
		return h(w, r, p)
	}
}

// touchDesktop records a use of the desktop by the request r; a failure is logged, not
// answered: the request itself did its work.
func (s *Server) touchDesktop(r *http.Request, p store.Project, id string) {
	// Past the request's end too: the use ended then, whether or not the caller stayed.
	if err := s.TouchDesktop(context.WithoutCancel(r.Context()), p.ID, id); err != nil {
		s.log.WarnContext(r.Context(), "desktop: record a use", "desktop", id, "err", err)
	}
}
