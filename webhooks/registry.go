package webhooks

import (
	"cmp"
	"context"
	"crypto/rand"
	"encoding/base64"
	"encoding/json"
	"errors"
	"fmt"
	"math"
	"net/http"
	"net/url"
	"regexp"
	"slices"
	"strconv"
	"strings"
	"time"

	"github.com/redis/go-redis/v9"

	"wb/desktop"
	"wb/internal/netguard"
	"wb/session"
	"wb/store"
)

// resolveTimeout bounds the lookup of an endpoint's host at registration.
const resolveTimeout = 5 * time.Second

// Object names and id prefixes.
const (
	EndpointObject = "webhook_endpoint"
	DeliveryObject = "webhook_delivery"
	EndpointPrefix = "whe_"
	DeliveryPrefix = "dlv_"
	SecretPrefix   = "whsec_"
	// AllEvents subscribes an endpoint to every public event type.
	AllEvents = "*"
)

// Limits.
const (
	MaxURLLen = 2048
	// DefaultMaxEndpoints is how many endpoints a project may register unless
	// RegistryOptions.MaxEndpoints says otherwise.
	DefaultMaxEndpoints = 16
	// MaxLogEntries is how many delivery attempts each endpoint's log keeps.
	MaxLogEntries = 1000
	// MaxDeliveriesLimit bounds a Deliveries page; 0 asks for DefaultDeliveriesLimit.
	MaxDeliveriesLimit     = 100
	DefaultDeliveriesLimit = 10
)

// Delivery statuses.
const (
	StatusSucceeded = "succeeded" // a 2xx answer
	StatusRetrying  = "retrying"  // failed; retried at next_attempt_at
	StatusGaveUp    = "gave_up"   // failed, and the retry window is over: the event is dropped
	StatusFailed    = "failed"    // failed and not retried: the delivery could not be made at all
)

// ErrNotFound: no such endpoint in this project.
var ErrNotFound = errors.New("webhook endpoint not found")

// Endpoint is a URL that receives a project's events.
type Endpoint struct {
	ID     string   `json:"id"`
	Object string   `json:"object"`
	URL    string   `json:"url"`
	Events []string `json:"events"`
	// Secret signs deliveries; it is returned by Create only.
	Secret    string       `json:"secret,omitempty"`
	CreatedAt session.Time `json:"created_at"`
}

// Subscribed reports whether the endpoint wants events of type typ.
func (e *Endpoint) Subscribed(typ string) bool {
	return slices.Contains(e.Events, typ) || slices.Contains(e.Events, AllEvents)
}

// Delivery is one attempt to deliver one event to one endpoint.
type Delivery struct {
	ID             string        `json:"id"`
	Object         string        `json:"object"`
	EndpointID     string        `json:"endpoint_id"`
	EventID        string        `json:"event_id"`
	EventType      string        `json:"event_type"`
	SessionID      *string       `json:"session_id"`
	Attempt        int           `json:"attempt"`
	Status         string        `json:"status"`
	ResponseStatus int           `json:"response_status"`
	Error          *string       `json:"error"`
	DurationMs     int64         `json:"duration_ms"`
	CreatedAt      session.Time  `json:"created_at"`
	NextAttemptAt  *session.Time `json:"next_attempt_at"`
}

// Registry stores webhook endpoints and their delivery logs. Safe for concurrent use.
type Registry struct {
	rdb          redis.UniversalClient
	now          func() time.Time
	guard        *netguard.Guard
	allowPrivate bool
	maxEndpoints int
}

// RegistryOptions configure a Registry. Zero values take the defaults.
type RegistryOptions struct {
	// AllowPrivate lets endpoint URLs resolve to loopback and other non-public addresses, at
	// registration and at delivery: for local testing only (`wb serve
	// --allow-private-webhooks`). By default such URLs are refused, as egress is.
	AllowPrivate bool
	// Guard resolves, checks and dials endpoint hosts (default: the platform deny list, with
	// the system resolver).
	Guard *netguard.Guard
	// MaxEndpoints caps each project's endpoints (default DefaultMaxEndpoints).
	MaxEndpoints int
}

// NewRegistry returns a Registry over any go-redis client (single server, Cluster, Ring),
// configured by at most one RegistryOptions.
func NewRegistry(rdb redis.UniversalClient, opts ...RegistryOptions) *Registry {
	var o RegistryOptions
	if len(opts) > 0 {
		o = opts[0]
	}
	if o.Guard == nil {
		o.Guard, _ = netguard.New(netguard.Options{}) // no allow prefixes: cannot fail
	}
	if o.MaxEndpoints <= 0 {
		o.MaxEndpoints = DefaultMaxEndpoints
	}
	return &Registry{rdb: rdb, now: time.Now, guard: o.Guard, allowPrivate: o.AllowPrivate, maxEndpoints: o.MaxEndpoints}
}

// checkHost refuses an endpoint URL whose host resolves to any address wb does not connect
// to on a tenant's behalf (loopback, private, link-local, metadata, the platform's own).
func (r *Registry) checkHost(ctx context.Context, raw string) error {
	if r.allowPrivate {
		return nil
	}
	u, err := url.Parse(raw)
	if err != nil {
		return &session.FieldError{Field: "url", Message: "is not a valid URL"}
	}
	rctx, cancel := context.WithTimeout(ctx, resolveTimeout)
	defer cancel()
	if _, err := r.guard.Resolve(rctx, u.Hostname()); err != nil {
		return &session.FieldError{Field: "url", Message: fmt.Sprintf(
			"must reach a public address: %v (a receiver on this machine needs wb serve --allow-private-webhooks)", err)}
	}
	return nil
}

// transport delivers to endpoints: each new connection is resolved once, checked like
// registration, and dialled at the checked address. Either way it reads at most
// netguard.MaxResponseHeaderBytes of an endpoint's response headers.
func (r *Registry) transport() *http.Transport {
	if r.allowPrivate {
		t := http.DefaultTransport.(*http.Transport).Clone()
		t.Proxy = nil
		t.MaxResponseHeaderBytes = netguard.MaxResponseHeaderBytes
		return t
	}
	return r.guard.Transport()
}

// ValidateURL checks an endpoint URL: absolute http or https, with a host, at most
// MaxURLLen characters.
func ValidateURL(raw string) error {
	if raw == "" {
		return &session.FieldError{Field: "url", Message: "is required"}
	}
	if len(raw) > MaxURLLen {
		return &session.FieldError{Field: "url", Message: fmt.Sprintf("at most %d characters", MaxURLLen)}
	}
	u, err := url.Parse(raw)
	if err != nil {
		return &session.FieldError{Field: "url", Message: "is not a valid URL"}
	}
	if u.Scheme != "http" && u.Scheme != "https" {
		return &session.FieldError{Field: "url", Message: fmt.Sprintf("must be an absolute http or https URL, got %q", raw)}
	}
	if u.Hostname() == "" {
		return &session.FieldError{Field: "url", Message: "must have a host"}
	}
	if u.User != nil {
		return &session.FieldError{Field: "url", Message: "must not carry credentials"}
	}
	return nil
}

// PublicEvents are the event types delivered to endpoints: the sessions' and the desktops'
// (WebhookEventType in gateway/openapi.json, besides "*").
func PublicEvents() []string { return append(session.PublicEvents(), desktop.Events()...) }

// ValidateEvents checks an endpoint's event list and returns it without duplicates.
func ValidateEvents(events []string) ([]string, error) {
	valid := append(PublicEvents(), AllEvents)
	if len(events) == 0 {
		return nil, &session.FieldError{Field: "events", Message: fmt.Sprintf(
			"give at least one event type; expected any of %s", strings.Join(valid, ", "))}
	}
	out := make([]string, 0, len(events))
	for _, e := range events {
		if !slices.Contains(valid, e) {
			return nil, &session.FieldError{Field: "events", Message: fmt.Sprintf(
				"unknown event type %q; expected any of %s", e, strings.Join(valid, ", "))}
		}
		if !slices.Contains(out, e) {
			out = append(out, e)
		}
	}
	return out, nil
}

// NewSecret returns a fresh signing secret: "whsec_" and the base64 of 24 random bytes.
func NewSecret() string {
	b := make([]byte, 24)
	_, _ = rand.Read(b) // crypto/rand.Read never fails (Go ≥ 1.24)
	return SecretPrefix + base64.StdEncoding.EncodeToString(b)
}

// Create registers an endpoint for the project and returns it with its secret, which is
// shown only here. The URL's host must resolve to public addresses only (unless
// AllowPrivate), and the project may have at most MaxEndpoints endpoints.
func (r *Registry) Create(ctx context.Context, project, rawURL string, events []string) (Endpoint, error) {
	return r.CreateAs(ctx, project, "", rawURL, events)
}

// CreateAs is Create under id ("" makes a new one). An endpoint that has id already (made by
// an earlier request with the same Idempotency-Key, whose answer was lost) is answered as it
// is, with its secret, and nothing is added.
func (r *Registry) CreateAs(ctx context.Context, project, id, rawURL string, events []string) (Endpoint, error) {
	if id != "" {
		if e, err := r.get(ctx, project, id); err == nil || !errors.Is(err, ErrNotFound) {
			return e, err
		}
	}
	if err := ValidateURL(rawURL); err != nil {
		return Endpoint{}, err
	}
	events, err := ValidateEvents(events)
	if err != nil {
		return Endpoint{}, err
	}
	// Last, after the checks that need no lookup.
	if err := r.checkHost(ctx, rawURL); err != nil {
		return Endpoint{}, err
	}
	now := r.now()
	if id == "" {
		id = session.NewID(EndpointPrefix, now)
	}
	e := Endpoint{
		ID: id, Object: EndpointObject, URL: rawURL,
		Events: events, Secret: NewSecret(), CreatedAt: *session.At(now),
	}
	b, err := json.Marshal(e)
	if err != nil {
		return Endpoint{}, fmt.Errorf("encode webhook endpoint: %w", err)
	}
	added, err := createScript.Run(ctx, r.rdb, []string{projectKeys(project).endpoints()}, e.ID, b, r.maxEndpoints).Int()
	if err != nil {
		return Endpoint{}, fmt.Errorf("create webhook endpoint: %w", err)
	}
	if added == 2 { // made meanwhile by the request whose id it is
		return r.get(ctx, project, id)
	}
	if added == 0 {
		return Endpoint{}, &store.ConflictError{Message: fmt.Sprintf(
			"the project already has %d webhook endpoints, the most it may have; delete one (DELETE /v1/webhook_endpoints/{id}) or subscribe an existing one to more events", r.maxEndpoints)}
	}
	return e, nil
}

// Get returns the endpoint without its secret, or ErrNotFound.
func (r *Registry) Get(ctx context.Context, project, id string) (Endpoint, error) {
	e, err := r.get(ctx, project, id)
	e.Secret = ""
	return e, err
}

// get returns the endpoint with its secret.
func (r *Registry) get(ctx context.Context, project, id string) (Endpoint, error) {
	b, err := r.rdb.HGet(ctx, projectKeys(project).endpoints(), id).Bytes()
	if errors.Is(err, redis.Nil) {
		return Endpoint{}, ErrNotFound
	}
	if err != nil {
		return Endpoint{}, fmt.Errorf("get webhook endpoint %s: %w", id, err)
	}
	return decodeEndpoint(b)
}

func decodeEndpoint(b []byte) (Endpoint, error) {
	var e Endpoint
	if err := json.Unmarshal(b, &e); err != nil {
		return Endpoint{}, fmt.Errorf("decode webhook endpoint: %w", err)
	}
	return e, nil
}

// List returns the project's endpoints, newest first (by created_at, then id), without
// their secrets.
func (r *Registry) List(ctx context.Context, project string) ([]Endpoint, error) {
	all, err := r.list(ctx, project)
	for i := range all {
		all[i].Secret = ""
	}
	return all, err
}

// list returns the project's endpoints with their secrets, newest first.
func (r *Registry) list(ctx context.Context, project string) ([]Endpoint, error) {
	m, err := r.rdb.HGetAll(ctx, projectKeys(project).endpoints()).Result()
	if err != nil {
		return nil, fmt.Errorf("list webhook endpoints: %w", err)
	}
	out := make([]Endpoint, 0, len(m))
	for _, v := range m {
		e, err := decodeEndpoint([]byte(v))
		if err != nil {
			return nil, err
		}
		out = append(out, e)
	}
	slices.SortFunc(out, func(a, b Endpoint) int {
		return cmp.Or(b.CreatedAt.Compare(a.CreatedAt.Time), strings.Compare(b.ID, a.ID))
	})
	return out, nil
}

// Delete removes the endpoint, its delivery log and its count of queued bytes; deliveries
// still queued for it are dropped by the dispatcher. ErrNotFound if there is no such
// endpoint.
func (r *Registry) Delete(ctx context.Context, project, id string) error {
	k := projectKeys(project)
	var del *redis.IntCmd
	_, err := r.rdb.TxPipelined(ctx, func(p redis.Pipeliner) error {
		del = p.HDel(ctx, k.endpoints(), id)
		p.Del(ctx, k.log(id))
		p.HDel(ctx, k.queued(), id, "failing:"+id)
		return nil
	})
	if err != nil {
		return fmt.Errorf("delete webhook endpoint %s: %w", id, err)
	}
	if del.Val() == 0 {
		return ErrNotFound
	}
	return nil
}

var streamIDPattern = regexp.MustCompile(`^[0-9]{1,20}-[0-9]{1,20}$`)

// Deliveries returns a page of the endpoint's delivery attempts, newest first (in the order
// they were recorded; attempts to different sessions made at once may be recorded in either
// order), and the cursor of the next page ("" at the end). limit 0 means
// DefaultDeliveriesLimit.
func (r *Registry) Deliveries(ctx context.Context, project, endpointID string, limit int, cursor string) ([]Delivery, string, error) {
	if limit == 0 {
		limit = DefaultDeliveriesLimit
	}
	if limit < 1 || limit > MaxDeliveriesLimit {
		return nil, "", &session.FieldError{Field: "limit", Message: fmt.Sprintf("must be 1–%d", MaxDeliveriesLimit)}
	}
	end := "+"
	if cursor != "" {
		prev, ok := before(cursor)
		if !ok {
			return nil, "", &session.FieldError{Field: "cursor", Message: "is not a cursor this list returned"}
		}
		end = prev
	}
	k := projectKeys(project)
	var exists *redis.BoolCmd
	var page *redis.XMessageSliceCmd
	_, err := r.rdb.Pipelined(ctx, func(p redis.Pipeliner) error {
		exists = p.HExists(ctx, k.endpoints(), endpointID)
		page = p.XRevRangeN(ctx, k.log(endpointID), end, "-", int64(limit)+1)
		return nil
	})
	if err != nil {
		return nil, "", fmt.Errorf("list deliveries of %s: %w", endpointID, err)
	}
	if !exists.Val() {
		return nil, "", ErrNotFound
	}
	msgs := page.Val()
	next := ""
	if len(msgs) > limit {
		msgs = msgs[:limit]
		next = msgs[limit-1].ID
	}
	out := make([]Delivery, 0, len(msgs))
	for _, m := range msgs {
		s, _ := m.Values["d"].(string)
		var d Delivery
		if err := json.Unmarshal([]byte(s), &d); err != nil {
			return nil, "", fmt.Errorf("decode delivery %s of %s: %w", m.ID, endpointID, err)
		}
		out = append(out, d)
	}
	return out, next, nil
}

// before returns the stream id just before id, for an exclusive XREVRANGE end.
func before(id string) (string, bool) {
	if !streamIDPattern.MatchString(id) {
		return "", false
	}
	msStr, seqStr, _ := strings.Cut(id, "-")
	ms, err1 := strconv.ParseUint(msStr, 10, 64)
	seq, err2 := strconv.ParseUint(seqStr, 10, 64)
	switch {
	case err1 != nil || err2 != nil:
		return "", false
	case seq > 0:
		return fmt.Sprintf("%d-%d", ms, seq-1), true
	case ms > 0:
		return fmt.Sprintf("%d-%d", ms-1, uint64(math.MaxUint64)), true
	}
	return "0-0", true // nothing comes before; XREVRANGE 0-0 - finds nothing real
}
