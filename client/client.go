package client

import (
	"bytes"
	"context"
	crand "crypto/rand"
	"encoding/hex"
	"encoding/json"
	"errors"
	"fmt"
	"io"
	"math/rand/v2"
	"net/http"
	"net/url"
	"strconv"
	"strings"
	"time"
)

// Client calls one wb deployment with one project's API key. Safe for concurrent use.
type Client struct {
	base        *url.URL
	apiKey      string
	http        *http.Client
	maxAttempts int
	baseDelay   time.Duration
	maxDelay    time.Duration
	userAgent   string
}

// Option configures a Client.
type Option func(*Client)

// WithHTTPClient sends requests with hc (its transport, timeouts, proxies) instead of
// http.DefaultClient. Long calls (exec, runs, files) are bounded by their context, so hc should
// not set a short Timeout.
func WithHTTPClient(hc *http.Client) Option { return func(c *Client) { c.http = hc } }

// WithRetries sets how many attempts a call makes at most when answered 429 or 503 (1: no
// retry; default 4) and the first backoff delay (default 500 ms, doubled per attempt up to
// 30 s, with jitter). A Retry-After header wins over the computed delay.
func WithRetries(maxAttempts int, baseDelay time.Duration) Option {
	return func(c *Client) {
		c.maxAttempts = max(1, maxAttempts)
		if baseDelay > 0 {
			c.baseDelay = baseDelay
		}
	}
}

// WithUserAgent sets the User-Agent header of every request.
func WithUserAgent(ua string) Option { return func(c *Client) { c.userAgent = ua } }

// New returns a client of the deployment at baseURL (e.g. https://wb.example.com, without
// /v1) that authenticates with apiKey.
func New(baseURL, apiKey string, opts ...Option) (*Client, error) {
	u, err := url.Parse(strings.TrimRight(baseURL, "/"))
	if err != nil {
		return nil, fmt.Errorf("client: baseURL %q: %w", baseURL, err)
	}
	if (u.Scheme != "http" && u.Scheme != "https") || u.Host == "" {
		return nil, fmt.Errorf("client: baseURL %q: want an absolute http or https URL such as https://wb.example.com", baseURL)
	}
	if apiKey == "" {
		return nil, errors.New("client: apiKey is empty: give the project's API key (WB_API_KEY)")
	}
	c := &Client{base: u, apiKey: apiKey, http: http.DefaultClient, maxAttempts: 4,
		baseDelay: 500 * time.Millisecond, maxDelay: 30 * time.Second, userAgent: "wb-go-client"}
	for _, o := range opts {
		o(c)
	}
	return c, nil
}

// Error is an error answer of the API: its HTTP status and the body's error object. Use
// errors.As to get it from any call's error.
type Error struct {
	Status  int    `json:"-"`
	Type    string `json:"type"`
	Code    string `json:"code"`
	Param   string `json:"param,omitempty"`
	Message string `json:"message"`
	// RetryAfter is the answer's Retry-After, when it had one (429, 503).
	RetryAfter time.Duration `json:"-"`
}

func (e *Error) Error() string {
	s := fmt.Sprintf("wb: %d %s/%s: %s", e.Status, e.Type, e.Code, e.Message)
	if e.Param != "" {
		s += " (param " + e.Param + ")"
	}
	return s
}

// request is one logical call: retried attempts share it (and its idempotency key).
type request struct {
	method string
	path   string // below the base URL, e.g. /v1/sessions
	query  url.Values
	body   []byte // JSON, or raw bytes with contentType
	// bodyReader streams a body that cannot be buffered (a file upload); when set, the call
	// is retried only if it is an io.Seeker.
	bodyReader  io.Reader
	contentType string
	accept      string
}

func (c *Client) url(path string, q url.Values) string {
	u := *c.base
	u.Path = c.base.Path + path
	if len(q) > 0 {
		u.RawQuery = q.Encode()
	}
	return u.String()
}

// newIdempotencyKey is 128 random bits: unique per logical call.
func newIdempotencyKey() string {
	var b [16]byte
	_, _ = crand.Read(b[:]) // crypto/rand.Read never fails
	return hex.EncodeToString(b[:])
}

// send makes the call, retrying 429 and 503, and answers the first response that is not
// retried. A status of 400 or more is answered as *Error with the body consumed; otherwise
// the caller owns resp.Body.
func (c *Client) send(ctx context.Context, r request) (*http.Response, error) {
	var key string
	if r.method == http.MethodPost {
		key = newIdempotencyKey()
	}
	attempts := c.maxAttempts
	seeker, _ := r.bodyReader.(io.Seeker)
	if r.bodyReader != nil && seeker == nil {
		attempts = 1
	}
	for attempt := 1; ; attempt++ {
		var body io.Reader
		switch {
		case r.bodyReader != nil:
			if attempt > 1 {
				if _, err := seeker.Seek(0, io.SeekStart); err != nil {
					return nil, fmt.Errorf("wb: rewind the body to retry: %w", err)
				}
			}
			switch r.bodyReader.(type) {
			case *bytes.Reader, *strings.Reader, *bytes.Buffer:
				body = r.bodyReader // NewRequest takes its length from these
			default:
				body = struct{ io.Reader }{r.bodyReader} // hide Close: the transport would close the caller's file
			}
		case r.body != nil:
			body = bytes.NewReader(r.body)
		}
		req, err := http.NewRequestWithContext(ctx, r.method, c.url(r.path, r.query), body)
		if err != nil {
			return nil, fmt.Errorf("wb: %s %s: %w", r.method, r.path, err)
		}
		req.Header.Set("Authorization", "Bearer "+c.apiKey)
		req.Header.Set("User-Agent", c.userAgent)
		if body != nil {
			ct := r.contentType
			if ct == "" {
				ct = "application/json"
			}
			req.Header.Set("Content-Type", ct)
		}
		if r.accept != "" {
			req.Header.Set("Accept", r.accept)
		} else {
			req.Header.Set("Accept", "application/json")
		}
		if key != "" {
			req.Header.Set("Idempotency-Key", key)
		}
		resp, err := c.http.Do(req)
		if err != nil {
			return nil, fmt.Errorf("wb: %s %s: %w", r.method, r.path, err)
		}
		if resp.StatusCode < 400 {
			return resp, nil
		}
		apiErr := readError(resp)
		retry := resp.StatusCode == http.StatusTooManyRequests || resp.StatusCode == http.StatusServiceUnavailable
		if !retry || attempt >= attempts {
			return nil, apiErr
		}
		delay := c.backoff(attempt)
		if apiErr.RetryAfter > 0 {
			delay = apiErr.RetryAfter
		}
		if dl, ok := ctx.Deadline(); ok && time.Until(dl) < delay {
			return nil, apiErr // waiting would outlive the caller's deadline
		}
		t := time.NewTimer(delay)
		select {
		case <-ctx.Done():
			t.Stop()
			return nil, fmt.Errorf("wb: %s %s: %w (last answer: %w)", r.method, r.path, ctx.Err(), apiErr)
		case <-t.C:
		}
	}
}

// backoff is the delay before attempt+1: base·2^(attempt-1), capped, with ±25 % jitter so
// that many callers do not retry in step.
func (c *Client) backoff(attempt int) time.Duration {
	d := c.baseDelay << min(attempt-1, 16)
	if d <= 0 || d > c.maxDelay {
		d = c.maxDelay
	}
	return time.Duration(float64(d) * (0.75 + rand.Float64()/2))
}

// readError turns an error answer into *Error, whatever its body.
func readError(resp *http.Response) *Error {
	defer resp.Body.Close()
	b, _ := io.ReadAll(io.LimitReader(resp.Body, 1<<20))
	var body struct {
		Error *Error `json:"error"`
	}
	e := &Error{}
	if json.Unmarshal(b, &body) == nil && body.Error != nil {
		e = body.Error
	} else {
		e.Type, e.Code = "api_error", "unexpected_answer"
		e.Message = strings.TrimSpace(string(b))
		if e.Message == "" {
			e.Message = http.StatusText(resp.StatusCode)
		}
	}
	e.Status = resp.StatusCode
	e.RetryAfter = parseRetryAfter(resp.Header.Get("Retry-After"))
	return e
}

// parseRetryAfter reads delay-seconds or an HTTP date; 0 when absent or unreadable.
func parseRetryAfter(v string) time.Duration {
	if v == "" {
		return 0
	}
	if n, err := strconv.Atoi(v); err == nil && n >= 0 {
		return time.Duration(n) * time.Second
	}
	if t, err := http.ParseTime(v); err == nil {
		return max(0, time.Until(t))
	}
	return 0
}

// do sends a JSON call and decodes a JSON answer into out (nil: discard it).
func (c *Client) do(ctx context.Context, method, path string, q url.Values, in, out any) error {
	r := request{method: method, path: path, query: q}
	if in != nil {
		b, err := json.Marshal(in)
		if err != nil {
			return fmt.Errorf("wb: encode the body of %s %s: %w", method, path, err)
		}
		r.body = b
	}
	resp, err := c.send(ctx, r)
	if err != nil {
		return err
	}
	return decodeJSON(resp, method, path, out)
}

// decodeJSON decodes a JSON answer into out (nil: discard it) and closes the body.
func decodeJSON(resp *http.Response, method, path string, out any) error {
	defer resp.Body.Close()
	if out == nil {
		_, _ = io.Copy(io.Discard, resp.Body)
		return nil
	}
	if err := json.NewDecoder(resp.Body).Decode(out); err != nil {
		return fmt.Errorf("wb: decode the answer of %s %s: %w", method, path, err)
	}
	return nil
}

// pathID escapes one path segment (an id or a name).
func pathID(id string) string { return url.PathEscape(id) }

// pageQuery is the ?limit=&cursor= of a list call.
func pageQuery(q url.Values, p Page) url.Values {
	if q == nil {
		q = url.Values{}
	}
	if p.Limit > 0 {
		q.Set("limit", strconv.Itoa(p.Limit))
	}
	if p.Cursor != "" {
		q.Set("cursor", p.Cursor)
	}
	return q
}
