// space-statefile stores runsc checkpoint images in a form that deduplicates, and gives them
// back bit for bit.
//
// runsc (Debian's 2022-12 build) writes its state file as a header followed by blocks of up to
// 1 MiB, each compressed on its own with Go's compress/flate at BestSpeed:
//
//	"gVisorSF" | u64 metadata length | metadata JSON | 32-byte MAC | u32 block size | blocks
//	block: u32 length | raw deflate
//
// Compressed blocks of two checkpoints of an idle sandbox share nothing (a change shifts what
// follows it), while their contents share most bytes. `inflate` rewrites a state file with
// every block decompressed whose decompressed form this program's compress/flate (the same Go
// release that built runsc) compresses back to exactly the same bytes; any other block stays
// as it was. `deflate` reverses it and checks the SHA-256 of the result against the original's.
//
//	space-statefile inflate IN OUT   exit 0; 3 if IN is not a state file this program reads
//	space-statefile deflate IN OUT   exit 0; 4 if IN is malformed or the result differs
//
// Encoded form: "SPACESF\x01" | sha256 of the original (32) | u64 original size |
// u32 header length | header | records until the end: u8 kind | u32 length | bytes, where kind
// 0 is a block kept compressed, 1 a block stored decompressed, 2 bytes after the last block.
package main

import (
	"bufio"
	"bytes"
	"compress/flate"
	"crypto/sha256"
	"encoding/binary"
	"errors"
	"fmt"
	"io"
	"os"
	"runtime"
	"sync"
)

var encMagic = []byte("SPACESF\x01")

const maxBlock = 64 << 20

type notStateFile struct{ why string }

func (e notStateFile) Error() string { return "not a gVisor state file: " + e.why }

func recompress(raw []byte) ([]byte, error) {
	var b bytes.Buffer
	w, err := flate.NewWriter(&b, flate.BestSpeed)
	if err != nil {
		return nil, err
	}
	if _, err := w.Write(raw); err != nil {
		return nil, err
	}
	if err := w.Close(); err != nil {
		return nil, err
	}
	return b.Bytes(), nil
}

// parallel runs f(i) for every i in [0, n) on every CPU, and returns when all are done.
func parallel(n int, f func(i int)) {
	next := make(chan int)
	var wg sync.WaitGroup
	for w := 0; w < runtime.NumCPU(); w++ {
		wg.Add(1)
		go func() {
			defer wg.Done()
			for i := range next {
				f(i)
			}
		}()
	}
	for i := 0; i < n; i++ {
		next <- i
	}
	close(next)
	wg.Wait()
}

func record(w io.Writer, kind byte, data []byte) error {
	var h [5]byte
	h[0] = kind
	binary.BigEndian.PutUint32(h[1:], uint32(len(data)))
	if _, err := w.Write(h[:]); err != nil {
		return err
	}
	_, err := w.Write(data)
	return err
}

func inflate(in []byte, out io.Writer) error {
	if len(in) < 16 || string(in[:8]) != "gVisorSF" {
		return notStateFile{"no gVisorSF magic"}
	}
	metaLen := binary.BigEndian.Uint64(in[8:16])
	if metaLen > uint64(len(in)) || 16+metaLen+32+4 > uint64(len(in)) {
		return notStateFile{"metadata longer than the file"}
	}
	head := int(16 + metaLen + 32 + 4)
	sum := sha256.Sum256(in)
	bw := bufio.NewWriterSize(out, 1<<20)
	bw.Write(encMagic)
	bw.Write(sum[:])
	var n [8]byte
	binary.BigEndian.PutUint64(n[:], uint64(len(in)))
	bw.Write(n[:])
	binary.BigEndian.PutUint32(n[:4], uint32(head))
	bw.Write(n[:4])
	bw.Write(in[:head])
	// Blocks are found first, then decompressed and checked on every CPU at once, then written in order.
	type block struct {
		comp, raw []byte
	}
	var blocks []block
	off := head
	for off+4 <= len(in) {
		l := int(binary.BigEndian.Uint32(in[off:]))
		if l > maxBlock || off+4+l > len(in) {
			break
		}
		blocks = append(blocks, block{comp: in[off+4 : off+4+l]})
		off += 4 + l
	}
	parallel(len(blocks), func(i int) {
		b := &blocks[i]
		raw, err := io.ReadAll(io.LimitReader(flate.NewReader(bytes.NewReader(b.comp)), maxBlock+1))
		if err != nil || len(raw) > maxBlock {
			return
		}
		if again, err := recompress(raw); err == nil && bytes.Equal(again, b.comp) {
			b.raw = raw
		}
	})
	for _, b := range blocks {
		kind, data := byte(0), b.comp
		if b.raw != nil {
			kind, data = 1, b.raw
		}
		if err := record(bw, kind, data); err != nil {
			return err
		}
	}
	if off < len(in) {
		if err := record(bw, 2, in[off:]); err != nil {
			return err
		}
	}
	return bw.Flush()
}

func deflate(r io.Reader, out io.Writer) error {
	br := bufio.NewReaderSize(r, 1<<20)
	var fixed [8 + 32 + 8 + 4]byte
	if _, err := io.ReadFull(br, fixed[:]); err != nil || !bytes.Equal(fixed[:8], encMagic) {
		return errors.New("not an encoded state file")
	}
	want := fixed[8:40]
	size := binary.BigEndian.Uint64(fixed[40:48])
	headLen := binary.BigEndian.Uint32(fixed[48:52])
	if headLen > 1<<20 {
		return errors.New("header too large")
	}
	h := sha256.New()
	bw := bufio.NewWriterSize(out, 1<<20)
	w := io.MultiWriter(bw, h)
	var written uint64
	emit := func(b []byte) error {
		written += uint64(len(b))
		_, err := w.Write(b)
		return err
	}
	head := make([]byte, headLen)
	if _, err := io.ReadFull(br, head); err != nil {
		return errors.New("truncated header")
	}
	if err := emit(head); err != nil {
		return err
	}
	// Records are read first, then blocks are compressed on every CPU at once, then written in order.
	type rec struct {
		kind byte
		data []byte
	}
	var recs []rec
	var rh [5]byte
	for {
		if _, err := io.ReadFull(br, rh[:]); err == io.EOF {
			break
		} else if err != nil {
			return errors.New("truncated record")
		}
		l := binary.BigEndian.Uint32(rh[1:])
		if l > maxBlock {
			return errors.New("record too large")
		}
		if rh[0] > 2 {
			return fmt.Errorf("unknown record kind %d", rh[0])
		}
		data := make([]byte, l)
		if _, err := io.ReadFull(br, data); err != nil {
			return errors.New("truncated record")
		}
		recs = append(recs, rec{rh[0], data})
	}
	errs := make([]error, len(recs))
	parallel(len(recs), func(i int) {
		if recs[i].kind == 1 {
			recs[i].data, errs[i] = recompress(recs[i].data)
		}
	})
	for i, r := range recs {
		if errs[i] != nil {
			return errs[i]
		}
		if r.kind != 2 {
			var n [4]byte
			binary.BigEndian.PutUint32(n[:], uint32(len(r.data)))
			if err := emit(n[:]); err != nil {
				return err
			}
		}
		if err := emit(r.data); err != nil {
			return err
		}
	}
	if written != size || !bytes.Equal(h.Sum(nil), want) {
		return fmt.Errorf("the rebuilt state file differs from the original (%d of %d bytes; SHA-256 mismatch)", written, size)
	}
	return bw.Flush()
}

func main() {
	if len(os.Args) != 4 || (os.Args[1] != "inflate" && os.Args[1] != "deflate") {
		fmt.Fprintln(os.Stderr, "usage: space-statefile inflate|deflate IN OUT")
		os.Exit(2)
	}
	out, err := os.OpenFile(os.Args[3], os.O_WRONLY|os.O_CREATE|os.O_TRUNC, 0o600)
	if err != nil {
		fmt.Fprintln(os.Stderr, err)
		os.Exit(1)
	}
	if os.Args[1] == "inflate" {
		in, err := os.ReadFile(os.Args[2])
		if err == nil {
			err = inflate(in, out)
		}
		if err != nil {
			fmt.Fprintln(os.Stderr, "space-statefile:", err)
			if errors.As(err, new(notStateFile)) {
				os.Exit(3)
			}
			os.Exit(1)
		}
	} else {
		in, err := os.Open(os.Args[2])
		if err == nil {
			err = deflate(in, out)
			in.Close()
		}
		if err != nil {
			fmt.Fprintln(os.Stderr, "space-statefile:", err)
			os.Exit(4)
		}
	}
	if err := out.Close(); err != nil {
		fmt.Fprintln(os.Stderr, err)
		os.Exit(1)
	}
}
