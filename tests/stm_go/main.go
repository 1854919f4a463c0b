// Command stminterop is Go's side of tests/stm.rs's interop test: it runs STM increments
// of one counter key with etcd's own Go concurrency.NewSTM (etcd 3.4's clientv3, as
// Debian's golang-etcd-server-dev ships it) while the Rust side increments the same key.
//
// Built by the test, offline, in GOPATH mode:
//
//	GO111MODULE=off GOPATH=$(mktemp -d):/usr/share/gocode GOFLAGS= go build -o stminterop .
//	./stminterop -endpoints http://127.0.0.1:2379 -key counter -n 50 -workers 2
//
// Prints "ready" once connected, waits for a line on stdin, then prints
// "done commits=<n> attempts=<n>" and exits 0, or an error on stderr and exits 1.
package main

import (
	"bufio"
	"context"
	"flag"
	"fmt"
	"os"
	"strconv"
	"strings"
	"sync"
	"sync/atomic"
	"time"

	"go.etcd.io/etcd/clientv3"
	"go.etcd.io/etcd/clientv3/concurrency"
)

func main() {
	endpoints := flag.String("endpoints", "http://127.0.0.1:2379", "etcd endpoints, comma separated")
	key := flag.String("key", "counter", "the counter key")
	n := flag.Int("n", 50, "increments per worker")
	workers := flag.Int("workers", 2, "goroutines, each with its own client")
	iso := flag.String("iso", "serializable-snapshot", "serializable-snapshot, serializable or repeatable-reads")
	flag.Parse()

	levels := map[string]concurrency.Isolation{
		"serializable-snapshot": concurrency.SerializableSnapshot,
		"serializable":          concurrency.Serializable,
		"repeatable-reads":      concurrency.RepeatableReads,
	}
	level, ok := levels[*iso]
	if !ok {
		fmt.Fprintf(os.Stderr, "unknown -iso %q\n", *iso)
		os.Exit(2)
	}
	clients := make([]*clientv3.Client, *workers)
	for i := range clients {
		c, err := clientv3.New(clientv3.Config{Endpoints: strings.Split(*endpoints, ","), DialTimeout: 5 * time.Second})
		if err != nil {
			fmt.Fprintln(os.Stderr, "connect:", err)
			os.Exit(1)
		}
		defer c.Close()
		clients[i] = c
	}
	fmt.Println("ready")
	if _, err := bufio.NewReader(os.Stdin).ReadString('\n'); err != nil {
		fmt.Fprintln(os.Stderr, "stdin:", err)
		os.Exit(1)
	}

	var attempts, commits int64
	var mu sync.Mutex
	var failed error
	var wg sync.WaitGroup
	for _, c := range clients {
		wg.Add(1)
		go func(c *clientv3.Client) {
			defer wg.Done()
			for i := 0; i < *n; i++ {
				ctx, cancel := context.WithTimeout(context.Background(), 60*time.Second)
				_, err := concurrency.NewSTM(c, func(s concurrency.STM) error {
					atomic.AddInt64(&attempts, 1)
					v := 0
					if raw := s.Get(*key); raw != "" {
						parsed, err := strconv.Atoi(raw)
						if err != nil {
							return err
						}
						v = parsed
					}
					s.Put(*key, strconv.Itoa(v+1))
					return nil
				}, concurrency.WithIsolation(level), concurrency.WithAbortContext(ctx))
				cancel()
				if err != nil {
					mu.Lock()
					failed = err
					mu.Unlock()
					return
				}
				atomic.AddInt64(&commits, 1)
			}
		}(c)
	}
	wg.Wait()
	if failed != nil {
		fmt.Fprintln(os.Stderr, "stm:", failed)
		os.Exit(1)
	}
	fmt.Printf("done commits=%d attempts=%d\n", commits, attempts)
}
