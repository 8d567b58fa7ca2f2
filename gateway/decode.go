package gateway

import (
	"bytes"
	"encoding/json"
	"errors"
	"fmt"
	"io"
	"mime"
	"net/http"
	"strings"

	"wb/session"
)

// MaxBodyBytes bounds every JSON request body.
const MaxBodyBytes = 1 << 20

// readBody reads a JSON body of at most MaxBodyBytes, checking its content type.
func readBody(r *http.Request) ([]byte, error) {
	if ct := r.Header.Get("Content-Type"); ct != "" {
		mt, _, err := mime.ParseMediaType(ct)
		if err != nil || mt != "application/json" {
			return nil, &apiError{Status: 415, Type: "invalid_request", Code: "unsupported_media_type",
				Message: fmt.Sprintf("Content-Type must be application/json, got %q", ct)}
		}
	}
	b, err := io.ReadAll(io.LimitReader(r.Body, MaxBodyBytes+1))
	if err != nil {
		return nil, errInvalid("", "could not read the request body: %v", err)
	}
	if len(b) > MaxBodyBytes {
		return nil, &apiError{Status: 413, Type: "invalid_request", Code: "too_large",
			Message: fmt.Sprintf("request body is over %d bytes", MaxBodyBytes)}
	}
	return b, nil
}

// decodeStrict decodes one JSON object into v, rejecting unknown fields, trailing data and
// values of the wrong type, each with a message that names the field.
func decodeStrict(b []byte, v any) error {
	if len(bytes.TrimSpace(b)) == 0 {
		return errInvalid("", "request body is empty; send a JSON object")
	}
	dec := json.NewDecoder(bytes.NewReader(b))
	dec.DisallowUnknownFields()
	if err := dec.Decode(v); err != nil {
		return jsonError(err)
	}
	if dec.More() {
		return errInvalid("", "request body has data after the JSON object")
	}
	if _, err := dec.Token(); !errors.Is(err, io.EOF) {
		return errInvalid("", "request body has data after the JSON object")
	}
	return nil
}

func jsonError(err error) error {
	var syn *json.SyntaxError
	var typ *json.UnmarshalTypeError
	var ae *apiError
	switch {
	case errors.As(err, &ae):
		return ae
	case errors.As(err, &syn):
		return errInvalid("", "malformed JSON at byte %d: %v", syn.Offset, syn)
	case errors.As(err, &typ):
		field := typ.Field
		if field == "" {
			return errInvalid("", "request body must be a JSON object, got %s", typ.Value)
		}
		want := typ.Type.String()
		if strings.Contains(want, "int") {
			want = "an integer in range"
		}
		return errInvalid(field, "%s: expected %s, got %s", field, want, typ.Value)
	case errors.Is(err, io.ErrUnexpectedEOF):
		return errInvalid("", "malformed JSON: the body ends early")
	case strings.HasPrefix(err.Error(), "json: unknown field "):
		name := strings.Trim(strings.TrimPrefix(err.Error(), "json: unknown field "), `"`)
		return errInvalid(name, "unknown field %q", name)
	}
	var fe *session.FieldError
	if errors.As(err, &fe) {
		return toAPIError(err)
	}
	return errInvalid("", "invalid JSON: %v", err)
}
