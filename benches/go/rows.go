package main

// The contender-count rows (issue 28), as benches/compare/rows.rs measures them for
// etcd-sync: at each count of -rows, that many goroutines, each with its own client and
// session (a process of its own), take turns on one Mutex. The first N acquisitions (and at
// least 1 s) are a warm-up; then a window of -total acquisitions or -row-secs, whichever
// comes first, is measured: acquisitions/s, the handoff (release start -> the next
// holder's Lock returns) median and p99, and from etcd's /metrics read at both ends of
// the window, per acquisition: watch events delivered (etcd_debugging_mvcc_events_total),
// watch responses sent, Range, Txn and etcd's CPU time (process_cpu_seconds_total). Then
// every waiter is cancelled (Go's Lock removes its key when its context ends) and the
// clients are closed, 16 at a time; the next row starts once etcd is quiet.

import (
	"context"
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

const setupWorkers = 16

func rowCounts() []int {
	var out []int
	for _, f := range strings.Split(*rowsFlag, ",") {
		if f = strings.TrimSpace(f); f == "" {
			continue
		}
		if v, err := strconv.Atoi(f); err == nil && v >= 2 {
			out = append(out, v)
		}
	}
	return out
}

type contender struct {
	cli *clientv3.Client
	s   *concurrency.Session
}

// connectMany connects n contenders, setupWorkers at a time.
func connectMany(n int) ([]contender, error) {
	out := make([]contender, n)
	var next int64 = -1
	var firstErr error
	var mu sync.Mutex
	var wg sync.WaitGroup
	for w := 0; w < setupWorkers && w < n; w++ {
		wg.Add(1)
		go func() {
			defer wg.Done()
			for {
				i := int(atomic.AddInt64(&next, 1))
				if i >= n {
					return
				}
				c, err := newClient()
				if err == nil {
					var s *concurrency.Session
					s, err = concurrency.NewSession(c)
					if err == nil {
						out[i] = contender{c, s}
						continue
					}
					c.Close()
				}
				mu.Lock()
				if firstErr == nil {
					firstErr = err
				}
				mu.Unlock()
				atomic.StoreInt64(&next, int64(n))
				return
			}
		}()
	}
	wg.Wait()
	if firstErr != nil {
		closeMany(out)
		return nil, fmt.Errorf("connecting %d contenders: %v", n, firstErr)
	}
	return out, nil
}

func closeMany(cs []contender) {
	var wg sync.WaitGroup
	for w := 0; w < setupWorkers; w++ {
		wg.Add(1)
		go func(w int) {
			defer wg.Done()
			for i := w; i < len(cs); i += setupWorkers {
				if cs[i].s != nil {
					cs[i].s.Close()
				}
				if cs[i].cli != nil {
					cs[i].cli.Close()
				}
			}
		}(w)
	}
	wg.Wait()
}

// quiesce waits (at most limit) until etcd has at most maxWatchers watchers and used under
// 10 % of a core over the last 500 ms.
func quiesce(maxWatchers float64, limit time.Duration) time.Duration {
	t := time.Now()
	last, lastErr := fetchCounters()
	lastT := time.Now()
	for time.Since(t) < limit {
		time.Sleep(500 * time.Millisecond)
		now, err := fetchCounters()
		nowT := time.Now()
		if err == nil && lastErr == nil {
			cpu := (now.plain["process_cpu_seconds_total"] - last.plain["process_cpu_seconds_total"]) / nowT.Sub(lastT).Seconds()
			if cpu < 0.1 && now.plain["etcd_debugging_mvcc_watcher_total"] <= maxWatchers {
				break
			}
		}
		last, lastErr, lastT = now, err, nowT
	}
	return time.Since(t)
}

// perAcq formats etcd's work between two snapshots per acquisition.
func perAcq(before, after counters, k int64) string {
	d := float64(k)
	if d < 1 {
		d = 1
	}
	c := newCounters()
	c.addDelta(after, before)
	return fmt.Sprintf("events_per_acq=%.2f watch_msgs_sent_per_acq=%.2f range_per_acq=%.3f txn_per_acq=%.2f watch_streams_per_acq=%.3f etcd_cpu_us_per_acq=%.0f",
		c.plain["etcd_debugging_mvcc_events_total"]/d, c.msgSent["Watch"]/d, c.handled["Range"]/d, c.handled["Txn"]/d,
		c.started["Watch"]/d, c.plain["process_cpu_seconds_total"]*1e6/d)
}

type handoffAt struct {
	c int64
	d time.Duration
}

func row(n int) error {
	t := time.Now()
	cs, err := connectMany(n)
	if err != nil {
		return err
	}
	setup := time.Since(t)
	key := fmt.Sprintf("%s/row-%d", *prefix, n)
	ctx, cancel := context.WithCancel(context.Background())
	var (
		count, violations, errCount int64
		holders                     int32
		mu                          sync.Mutex
		lastRelease                 time.Time
		lastHolder                  = -1
		lastToken                   int64
		handoffs                    []handoffAt
		errs                        []string
		wg                          sync.WaitGroup
		start                       = make(chan struct{})
	)
	for w := 0; w < n; w++ {
		wg.Add(1)
		go func(w int) {
			defer wg.Done()
			m := concurrency.NewMutex(cs[w].s, key)
			<-start
			for ctx.Err() == nil {
				lctx, lcancel := context.WithTimeout(ctx, 600*time.Second)
				err := m.Lock(lctx)
				lcancel()
				if err != nil {
					if ctx.Err() == nil {
						atomic.AddInt64(&errCount, 1)
						mu.Lock()
						if len(errs) < 10 {
							errs = append(errs, fmt.Sprintf("worker %d: lock: %v", w, err))
						}
						mu.Unlock()
					}
					return
				}
				acq := time.Now()
				if ctx.Err() != nil {
					uctx, ucancel := bounded()
					m.Unlock(uctx)
					ucancel()
					return
				}
				if atomic.AddInt32(&holders, 1) != 1 {
					atomic.AddInt64(&violations, 1)
				}
				c := atomic.AddInt64(&count, 1)
				token := m.Header().Revision
				mu.Lock()
				if token <= lastToken {
					violations++
				}
				lastToken = token
				if lastHolder >= 0 && lastHolder != w {
					handoffs = append(handoffs, handoffAt{c, acq.Sub(lastRelease)})
				}
				mu.Unlock()
				atomic.AddInt32(&holders, -1)
				mu.Lock()
				lastHolder, lastRelease = w, time.Now()
				mu.Unlock()
				uctx, ucancel := bounded()
				err = m.Unlock(uctx)
				ucancel()
				if err != nil && ctx.Err() == nil {
					atomic.AddInt64(&errCount, 1)
					return
				}
			}
		}(w)
	}
	close(start)
	limit := time.Duration(*rowSecs) * time.Second
	until := func(target int64, deadline time.Time) {
		for atomic.LoadInt64(&count) < target && time.Now().Before(deadline) && atomic.LoadInt64(&errCount) == 0 {
			time.Sleep(time.Millisecond)
		}
	}
	mark := func() (int64, time.Time, counters, error) {
		c0, t0 := atomic.LoadInt64(&count), time.Now()
		snap, err := fetchCounters()
		c1, t1 := atomic.LoadInt64(&count), time.Now()
		return (c0 + c1) / 2, t0.Add(t1.Sub(t0) / 2), snap, err
	}
	begun := time.Now()
	until(int64(n), begun.Add(limit))
	minWarm := time.Second
	if minWarm > limit {
		minWarm = limit
	}
	for time.Since(begun) < minWarm && atomic.LoadInt64(&errCount) == 0 {
		time.Sleep(time.Millisecond)
	}
	first, t0, before, err0 := mark()
	until(first+int64(*total), t0.Add(limit))
	last, t1, after, err1 := mark()
	cancel()
	finished := make(chan struct{})
	go func() { wg.Wait(); close(finished) }()
	left := ""
	select {
	case <-finished:
	case <-time.After(2 * wait):
		left = "workers still running at the deadline"
	}
	closeMany(cs)
	if err0 != nil || err1 != nil {
		return fmt.Errorf("reading etcd /metrics: %v %v", err0, err1)
	}
	mu.Lock()
	var in []time.Duration
	for _, h := range handoffs {
		if h.c > first && h.c <= last {
			in = append(in, h.d)
		}
	}
	e := append([]string(nil), errs...)
	mu.Unlock()
	k := last - first
	el := t1.Sub(t0)
	st, _ := computeStats(in)
	report(fmt.Sprintf("row_mutex_handoff_contenders_%d", n), in, fmt.Sprintf("contenders=%d", n))
	fmt.Printf("RESULT go row_mutex contenders=%d throughput_acq_s=%.1f acquisitions=%d window_ms=%d window_timed_out=%v handoff_median_us=%.0f handoff_p90_us=%.0f handoff_p99_us=%.0f handoffs=%d %s violations=%d errors=%d setup_ms=%d\n",
		n, float64(k)/el.Seconds(), k, el.Milliseconds(), k < int64(*total), st.median, st.p90, st.p99, len(in),
		perAcq(before, after, k), atomic.LoadInt64(&violations), atomic.LoadInt64(&errCount), setup.Milliseconds())
	for _, x := range e {
		fmt.Fprintf(os.Stderr, "gocompare: row %d: %s\n", n, x)
	}
	if left != "" {
		return fmt.Errorf("row %d: %s", n, left)
	}
	if atomic.LoadInt64(&errCount)+atomic.LoadInt64(&violations) > 0 {
		return fmt.Errorf("row %d: %d errors, %d violations", n, atomic.LoadInt64(&errCount), atomic.LoadInt64(&violations))
	}
	return nil
}

func rows() error {
	base, err := fetchCounters()
	if err != nil {
		return err
	}
	var bad []string
	for _, n := range rowCounts() {
		fmt.Fprintf(os.Stderr, "gocompare: rows: mutex, %d contenders ...\n", n)
		if err := row(n); err != nil {
			bad = append(bad, err.Error())
		}
		w := quiesce(base.plain["etcd_debugging_mvcc_watcher_total"], 2*wait)
		fmt.Fprintf(os.Stderr, "gocompare: rows: etcd quiet %.1f s after the %d-contender row\n", w.Seconds(), n)
	}
	if len(bad) > 0 {
		return fmt.Errorf("%s", strings.Join(bad, "; "))
	}
	return nil
}
