package main

// The STM rows (issue 30), as benches/compare/stm.rs measures them for etcd-sync:
// read-modify-write transactions per second with concurrency.NewSTM (its default isolation,
// serializable snapshot), -stm-workers goroutines with a client each, for -stm-secs: with
// no conflict (each worker increments its own key) and with high conflict (every worker
// increments one key). Each row checks its counters against its commits (violations).

import (
	"flag"
	"fmt"
	"strconv"
	"sync"
	"time"

	"go.etcd.io/etcd/clientv3"
	"go.etcd.io/etcd/clientv3/concurrency"
)

var (
	stmWorkers = flag.Int("stm-workers", 4, "workers of the STM rows, each with its own client")
	stmSecs    = flag.Int("stm-secs", 3, "measured window of each STM row, in seconds")
)

// stmIncrement runs one read-modify-write transaction on key, counting its attempts.
func stmIncrement(c *clientv3.Client, key string, attempts *int64) error {
	ctx, cancel := bounded()
	defer cancel()
	_, err := concurrency.NewSTM(c, func(s concurrency.STM) error {
		*attempts++
		n := 0
		if raw := s.Get(key); raw != "" {
			v, err := strconv.Atoi(raw)
			if err != nil {
				return err
			}
			n = v
		}
		s.Put(key, strconv.Itoa(n+1))
		return nil
	}, concurrency.WithAbortContext(ctx))
	return err
}

func stmRow(figure string, shared bool) error {
	workers := *stmWorkers
	if workers < 1 {
		workers = 1
	}
	window := time.Duration(*stmSecs) * time.Second
	key := func(w int) string {
		if shared {
			return fmt.Sprintf("%s/%s/counter", *prefix, figure)
		}
		return fmt.Sprintf("%s/%s/counter-%d", *prefix, figure, w)
	}
	clients := make([]*clientv3.Client, workers)
	for i := range clients {
		c, err := newClient()
		if err != nil {
			return err
		}
		defer c.Close()
		clients[i] = c
	}
	const warmup = 20
	type result struct {
		commits, attempts int64
		latencies         []time.Duration
		err               error
	}
	results := make([]result, workers)
	var ready, wg sync.WaitGroup
	start := make(chan struct{})
	ready.Add(workers)
	for w := range clients {
		wg.Add(1)
		go func(w int) {
			defer wg.Done()
			r := &results[w]
			var attempts int64
			for i := 0; i < warmup; i++ {
				if r.err = stmIncrement(clients[w], key(w), &attempts); r.err != nil {
					ready.Done()
					return
				}
			}
			ready.Done()
			<-start
			end := time.Now().Add(window)
			before := attempts
			for time.Now().Before(end) {
				t0 := time.Now()
				if r.err = stmIncrement(clients[w], key(w), &attempts); r.err != nil {
					return
				}
				r.latencies = append(r.latencies, time.Since(t0))
				r.commits++
			}
			r.attempts = attempts - before
		}(w)
	}
	ready.Wait()
	close(start)
	wg.Wait()
	var commits, attempts int64
	var latencies []time.Duration
	for _, r := range results {
		if r.err != nil {
			return r.err
		}
		commits += r.commits
		attempts += r.attempts
		latencies = append(latencies, r.latencies...)
	}
	// Every commit, warm-up included, is one increment: the counters must add up.
	keys := []string{key(0)}
	if !shared {
		keys = keys[:0]
		for w := 0; w < workers; w++ {
			keys = append(keys, key(w))
		}
	}
	var counted int64
	for _, k := range keys {
		ctx, cancel := bounded()
		resp, err := clients[0].Get(ctx, k)
		cancel()
		if err != nil {
			return err
		}
		if len(resp.Kvs) > 0 {
			v, err := strconv.ParseInt(string(resp.Kvs[0].Value), 10, 64)
			if err != nil {
				return err
			}
			counted += v
		}
	}
	violations := commits + int64(warmup*workers) - counted
	if violations < 0 {
		violations = -violations
	}
	perCommit := 0.0
	if commits > 0 {
		perCommit = float64(attempts) / float64(commits)
	}
	report(figure, latencies, fmt.Sprintf("workers=%d secs=%.1f commits=%d attempts=%d txn_s=%.0f attempts_per_commit=%.2f violations=%d",
		workers, window.Seconds(), commits, attempts, float64(commits)/window.Seconds(), perCommit, violations))
	ctx, cancel := bounded()
	defer cancel()
	_, err := clients[0].Delete(ctx, fmt.Sprintf("%s/%s/", *prefix, figure), clientv3.WithPrefix())
	return err
}

func stmRows() error {
	if err := stmRow("stm_0", false); err != nil {
		return err
	}
	return stmRow("stm_high", true)
}
