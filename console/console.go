package console

import (
	"embed"
	"io/fs"
	"net/http"
)

//go:embed static
var static embed.FS

// Prefix is the path the console is served under.
const Prefix = "/console"

// Handler serves the console's files under Prefix (mount it at Prefix + "/").
func Handler() http.Handler {
	files, _ := fs.Sub(static, "static") // fails only for an invalid name, which "static" is not
	serve := http.StripPrefix(Prefix, http.FileServerFS(files))
	return http.HandlerFunc(func(w http.ResponseWriter, r *http.Request) {
		h := w.Header()
		// Scripts and styles only from the console itself, no framing: the page holds an
		// API key. Screens arrive as blob: URLs made from the API's PNGs.
		h.Set("Content-Security-Policy", "default-src 'none'; script-src 'self'; style-src 'self'; img-src 'self' blob:; connect-src 'self'; base-uri 'none'; form-action 'none'; frame-ancestors 'none'")
		h.Set("X-Content-Type-Options", "nosniff")
		h.Set("Referrer-Policy", "no-referrer")
		h.Set("Cache-Control", "no-cache")
		serve.ServeHTTP(w, r)
	})
}
