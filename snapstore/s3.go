package snapstore

import (
	"context"
	"fmt"
	"io"

	"github.com/minio/minio-go/v7"
)

// S3 keeps objects in a bucket of an S3-compatible server, under an optional key prefix.
type S3 struct {
	Client *minio.Client
	Bucket string
	Prefix string // "" or ending in "/"
}

// Put uploads the object.
func (s S3) Put(ctx context.Context, key string, r io.Reader, size int64) error {
	if _, err := s.Client.PutObject(ctx, s.Bucket, s.Prefix+key, r, size,
		minio.PutObjectOptions{ContentType: "application/octet-stream"}); err != nil {
		return fmt.Errorf("snapstore: put s3://%s/%s%s: %w", s.Bucket, s.Prefix, key, err)
	}
	return nil
}

// Get answers the object's content. minio-go only asks the server on the first read, so
// the object is looked up first, for a missing one to be ErrNotFound here.
func (s S3) Get(ctx context.Context, key string) (io.ReadCloser, error) {
	obj, err := s.Client.GetObject(ctx, s.Bucket, s.Prefix+key, minio.GetObjectOptions{})
	if err == nil {
		_, err = obj.Stat()
	}
	if err != nil {
		if obj != nil {
			obj.Close()
		}
		if minio.ToErrorResponse(err).Code == minio.NoSuchKey {
			return nil, fmt.Errorf("%w: s3://%s/%s%s", ErrNotFound, s.Bucket, s.Prefix, key)
		}
		return nil, fmt.Errorf("snapstore: get s3://%s/%s%s: %w", s.Bucket, s.Prefix, key, err)
	}
	return obj, nil
}

// Delete removes the object (S3 answers success for a missing key).
func (s S3) Delete(ctx context.Context, key string) error {
	if err := s.Client.RemoveObject(ctx, s.Bucket, s.Prefix+key, minio.RemoveObjectOptions{}); err != nil {
		return fmt.Errorf("snapstore: delete s3://%s/%s%s: %w", s.Bucket, s.Prefix, key, err)
	}
	return nil
}

// List answers the keys under prefix, without the store's own prefix.
func (s S3) List(ctx context.Context, prefix string) ([]string, error) {
	var keys []string
	for o := range s.Client.ListObjects(ctx, s.Bucket, minio.ListObjectsOptions{Prefix: s.Prefix + prefix, Recursive: true}) {
		if o.Err != nil {
			return nil, fmt.Errorf("snapstore: list s3://%s/%s%s: %w", s.Bucket, s.Prefix, prefix, o.Err)
		}
		keys = append(keys, o.Key[len(s.Prefix):])
	}
	return keys, nil
}
