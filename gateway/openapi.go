package gateway

import (
	_ "embed"
	"net/http"
)

//go:embed openapi.json
var openapiDoc []byte

// OpenAPI returns the OpenAPI 3.1 document of the API.
func OpenAPI() []byte { return openapiDoc }

func serveOpenAPI(w http.ResponseWriter, _ *http.Request) {
	w.Header().Set("Content-Type", "application/json")
	_, _ = w.Write(openapiDoc)
}
