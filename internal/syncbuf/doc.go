// Package syncbuf holds Buffer, a bytes.Buffer that one goroutine may write (a logger, a
// process's output) while another reads it: the tests' one such buffer.
package syncbuf
