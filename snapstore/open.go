package snapstore

import (
	"context"
	"fmt"
	"net/url"
	"os"
	"strings"

	"github.com/minio/minio-go/v7"
	"github.com/minio/minio-go/v7/pkg/credentials"
)

// Open makes the store a URL names:
//
//	s3://BUCKET[/PREFIX]?endpoint=http://HOST:PORT&region=REGION
//	file:///DIR
//
// For s3, credentials come from AWS_ACCESS_KEY_ID and AWS_SECRET_ACCESS_KEY (and
// AWS_SESSION_TOKEN), looked up with getenv (os.Getenv); without endpoint it is AWS's own (https://s3.amazonaws.com). The
// bucket must exist: Open checks it, so that a wrong URL fails at start, not at the first
// snapshot.
func Open(ctx context.Context, rawURL string, getenv func(string) string) (*Store, error) {
	u, err := url.Parse(rawURL)
	if err != nil {
		return nil, fmt.Errorf("snapshot store %q: %w", rawURL, err)
	}
	switch u.Scheme {
	case "file":
		if u.Path == "" || u.Host != "" {
			return nil, fmt.Errorf("snapshot store %q: say file:///ABSOLUTE/DIR", rawURL)
		}
		if err := os.MkdirAll(u.Path, 0o700); err != nil {
			return nil, fmt.Errorf("snapshot store %q: %w", rawURL, err)
		}
		return &Store{Blobs: Dir{Root: u.Path}, Name: "file://" + u.Path}, nil
	case "s3":
		return openS3(ctx, u, getenv)
	default:
		return nil, fmt.Errorf("snapshot store %q: the scheme must be s3:// or file://", rawURL)
	}
}

func openS3(ctx context.Context, u *url.URL, getenv func(string) string) (*Store, error) {
	bucket := u.Host
	if bucket == "" {
		return nil, fmt.Errorf("snapshot store %q: no bucket: say s3://BUCKET?endpoint=…", u.Redacted())
	}
	prefix := strings.Trim(u.Path, "/")
	if prefix != "" {
		prefix += "/"
	}
	q := u.Query()
	endpoint, secure := "s3.amazonaws.com", true
	if e := q.Get("endpoint"); e != "" {
		eu, err := url.Parse(e)
		if err != nil || (eu.Scheme != "http" && eu.Scheme != "https") || eu.Host == "" {
			return nil, fmt.Errorf("snapshot store: endpoint %q must be http://HOST:PORT or https://HOST:PORT", e)
		}
		endpoint, secure = eu.Host, eu.Scheme == "https"
	}
	id, secret := getenv("AWS_ACCESS_KEY_ID"), getenv("AWS_SECRET_ACCESS_KEY")
	if id == "" || secret == "" {
		return nil, fmt.Errorf("snapshot store s3://%s: set AWS_ACCESS_KEY_ID and AWS_SECRET_ACCESS_KEY", bucket)
	}
	client, err := minio.New(endpoint, &minio.Options{
		Creds: credentials.NewStaticV4(id, secret, getenv("AWS_SESSION_TOKEN")), Secure: secure, Region: q.Get("region"),
		// An S3-compatible server on its own host name seldom resolves BUCKET.HOST.
		BucketLookup: minio.BucketLookupPath,
	})
	if err != nil {
		return nil, fmt.Errorf("snapshot store s3://%s: %w", bucket, err)
	}
	ok, err := client.BucketExists(ctx, bucket)
	if err != nil {
		return nil, fmt.Errorf("snapshot store s3://%s at %s: %w", bucket, endpoint, err)
	}
	if !ok {
		return nil, fmt.Errorf("snapshot store s3://%s at %s: no such bucket; create it first", bucket, endpoint)
	}
	return &Store{Blobs: S3{Client: client, Bucket: bucket, Prefix: prefix}, Name: "s3://" + bucket + "/" + prefix}, nil
}
