// Command gocompare measures etcd's own Go concurrency recipes (Mutex, Election, the code
// behind `etcdctl lock` and `etcdctl elect`) against a running etcd, printing the same
// `RESULT go <figure> key=value ...` lines as benches/compare/ prints for etcd-sync, so that
// scripts/bench-compare can put the two side by side.
//
// It is built against Debian's golang-etcd-server-dev (etcd 3.4, import path
// go.etcd.io/etcd/clientv3), offline, in GOPATH mode:
//
//	apt-get install -y golang-go golang-etcd-server-dev
//	GO111MODULE=off GOPATH=$(mktemp -d):/usr/share/gocode GOFLAGS= go build -o gocompare .
//	./gocompare -endpoints http://127.0.0.1:2379
//
// Latencies are in microseconds, percentiles are nearest-rank (as in
// benches/compare/stats.rs). Every wait is bounded: each Lock/Campaign has a 30 s context,
// and a watchdog ends the process after -timeout.
package main

import (
	"context"
	"flag"
	"fmt"
	"io/ioutil"
	"math"
	"net/http"
	"os"
	"sort"
	"strconv"
	"strings"
	"sync"
	"sync/atomic"
	"syscall"
	"time"

	"go.etcd.io/etcd/clientv3"
	"go.etcd.io/etcd/clientv3/concurrency"
)

// wait bounds every single Lock, Campaign or hand-over wait.
const wait = 30 * time.Second

var (
	endpoints  = flag.String("endpoints", "http://127.0.0.1:2379", "etcd endpoints, comma separated")
	n          = flag.Int("n", 1000, "uncontended Lock+Unlock and Get iterations")
	contenders = flag.Int("contenders", 8, "goroutines in the contended run, each with its own client and session")
	total      = flag.Int("total", 2000, "acquisitions in the contended run")
	campaigns  = flag.Int("campaigns", 500, "Campaign+Resign iterations")
	only       = flag.String("only", "", "run only these phases (comma separated): uncontended,election,cost,contended,rows,rangecost,stm (contended runs rows too)")
	rowsFlag   = flag.String("rows", "8,64,256,1024", "contender counts of the rows (issue 28), comma separated; each contender has its own client and session; empty: none")
	rowSecs    = flag.Int("row-secs", 20, "time bound of a row's warm-up, and again of its measured window, in seconds")
	timeout    = flag.Duration("timeout", 2400*time.Second, "abort the whole run after this long")
	prefix     = flag.String("prefix", fmt.Sprintf("compare/go/%d", os.Getpid()), "key prefix")
)

func endpointList() []string {
	var eps []string
	for _, e := range strings.Split(*endpoints, ",") {
		if e = strings.TrimSpace(e); e != "" {
			eps = append(eps, e)
		}
	}
	return eps
}

func newClient() (*clientv3.Client, error) {
	return clientv3.New(clientv3.Config{Endpoints: endpointList(), DialTimeout: 5 * time.Second})
}

func bounded() (context.Context, context.CancelFunc) {
	return context.WithTimeout(context.Background(), wait)
}

// ---- statistics -----------------------------------------------------------------------

type stats struct {
	n                                int
	median, p90, p99, mean, min, max float64
}

func computeStats(v []time.Duration) (stats, bool) {
	if len(v) == 0 {
		return stats{}, false
	}
	s := make([]float64, len(v))
	sum := 0.0
	for i, d := range v {
		s[i] = float64(d.Nanoseconds()) / 1e3
		sum += s[i]
	}
	sort.Float64s(s)
	k := len(s)
	rank := func(p float64) float64 {
		idx := int(math.Ceil(p * float64(k)))
		if idx < 1 {
			idx = 1
		}
		if idx > k {
			idx = k
		}
		return s[idx-1]
	}
	return stats{k, rank(0.5), rank(0.9), rank(0.99), sum / float64(k), s[0], s[k-1]}, true
}

func report(figure string, v []time.Duration, extra string) {
	st, ok := computeStats(v)
	if !ok {
		fmt.Printf("RESULT go %s n=0 error=no_samples\n", figure)
		return
	}
	if extra != "" {
		extra = " " + extra
	}
	fmt.Printf("RESULT go %s median_us=%.0f p90_us=%.0f p99_us=%.0f mean_us=%.0f min_us=%.0f max_us=%.0f n=%d%s\n",
		figure, st.median, st.p90, st.p99, st.mean, st.min, st.max, st.n, extra)
}

// processCPU is the user + system CPU time this process has used so far (getrusage).
func processCPU() time.Duration {
	var u syscall.Rusage
	if err := syscall.Getrusage(syscall.RUSAGE_SELF, &u); err != nil {
		return 0
	}
	return time.Duration(u.Utime.Nano() + u.Stime.Nano())
}

// cpuPerOp runs op n times alone and prints the client CPU per operation, as the Rust
// drivers do (issue 49).
func cpuPerOp(figure string, n int, op func() error) error {
	before := processCPU()
	for i := 0; i < n; i++ {
		if err := op(); err != nil {
			return err
		}
	}
	used := processCPU() - before
	fmt.Printf("RESULT go cpu_%s us_per_op=%.1f n=%d\n", figure, float64(used.Microseconds())/float64(n), n)
	return nil
}

// tail counts samples slower than 10 ms and 50 ms.
func tail(v []time.Duration) string {
	a, b := 0, 0
	for _, d := range v {
		if d > 10*time.Millisecond {
			a++
		}
		if d > 50*time.Millisecond {
			b++
		}
	}
	return fmt.Sprintf("over_10ms=%d over_50ms=%d", a, b)
}

// ---- etcd /metrics ----------------------------------------------------------------------

type counters struct {
	handled, started, msgReceived, msgSent map[string]float64
	unaryTotal                             float64
	// Unlabelled series: etcd_debugging_mvcc_events_total (events sent to watchers),
	// process_cpu_seconds_total, etcd_debugging_mvcc_watcher_total.
	plain map[string]float64
}

func newCounters() counters {
	return counters{map[string]float64{}, map[string]float64{}, map[string]float64{}, map[string]float64{}, 0, map[string]float64{}}
}

func label(labels, name string) (string, bool) {
	pat := name + `="`
	i := strings.Index(labels, pat)
	if i < 0 {
		return "", false
	}
	rest := labels[i+len(pat):]
	j := strings.IndexByte(rest, '"')
	if j < 0 {
		return "", false
	}
	return rest[:j], true
}

func fetchCounters() (counters, error) {
	c := newCounters()
	url := strings.TrimRight(endpointList()[0], "/")
	if !strings.Contains(url, "://") {
		url = "http://" + url
	}
	hc := http.Client{Timeout: 10 * time.Second}
	resp, err := hc.Get(url + "/metrics")
	if err != nil {
		return c, err
	}
	defer resp.Body.Close()
	body, err := ioutil.ReadAll(resp.Body)
	if err != nil {
		return c, err
	}
	if resp.StatusCode != 200 {
		return c, fmt.Errorf("GET /metrics: %s", resp.Status)
	}
	for _, line := range strings.Split(string(body), "\n") {
		if strings.HasPrefix(line, "#") {
			continue
		}
		sp := strings.LastIndexByte(line, ' ')
		br := strings.IndexByte(line, '{')
		if sp > 0 && br < 0 {
			if v, err := strconv.ParseFloat(strings.TrimSpace(line[sp+1:]), 64); err == nil {
				c.plain[line[:sp]] = v
			}
			continue
		}
		if sp < 0 || br < 0 || br > sp {
			continue
		}
		value, err := strconv.ParseFloat(strings.TrimSpace(line[sp+1:]), 64)
		if err != nil {
			continue
		}
		name, labels := line[:br], line[br:sp]
		method, ok := label(labels, "grpc_method")
		if !ok {
			continue
		}
		switch name {
		case "grpc_server_handled_total":
			if t, _ := label(labels, "grpc_type"); t == "unary" {
				c.unaryTotal += value
			}
			c.handled[method] += value
		case "grpc_server_started_total":
			c.started[method] += value
		case "grpc_server_msg_received_total":
			c.msgReceived[method] += value
		case "grpc_server_msg_sent_total":
			c.msgSent[method] += value
		}
	}
	return c, nil
}

// addDelta adds (after - before) into c.
func (c *counters) addDelta(after, before counters) {
	for k, v := range after.handled {
		c.handled[k] += v - before.handled[k]
	}
	for k, v := range after.started {
		c.started[k] += v - before.started[k]
	}
	for k, v := range after.msgReceived {
		c.msgReceived[k] += v - before.msgReceived[k]
	}
	for k, v := range after.msgSent {
		c.msgSent[k] += v - before.msgSent[k]
	}
	for k, v := range after.plain {
		c.plain[k] += v - before.plain[k]
	}
	c.unaryTotal += after.unaryTotal - before.unaryTotal
}

func (c counters) perOp(k int) string {
	d := float64(k)
	return fmt.Sprintf("txn=%.2f range=%.2f delete_range=%.2f put=%.2f unary_total=%.2f watch_streams=%.2f watch_msgs=%.2f",
		c.handled["Txn"]/d, c.handled["Range"]/d, c.handled["DeleteRange"]/d, c.handled["Put"]/d,
		c.unaryTotal/d, c.started["Watch"]/d, c.msgReceived["Watch"]/d)
}

// ---- phases -----------------------------------------------------------------------------

func uncontended() error {
	cli, err := newClient()
	if err != nil {
		return err
	}
	defer cli.Close()
	s, err := concurrency.NewSession(cli)
	if err != nil {
		return err
	}
	defer s.Close()
	m := concurrency.NewMutex(s, *prefix+"/uncontended")
	lockOnce := func() (time.Duration, time.Duration, error) {
		ctx, cancel := bounded()
		defer cancel()
		t0 := time.Now()
		if err := m.Lock(ctx); err != nil {
			return 0, 0, err
		}
		t1 := time.Now()
		if err := m.Unlock(ctx); err != nil {
			return 0, 0, err
		}
		return t1.Sub(t0), time.Since(t1), nil
	}
	get := func() error {
		ctx, cancel := bounded()
		defer cancel()
		_, err := cli.Get(ctx, *prefix+"/warmup")
		return err
	}
	for i := 0; i < 100; i++ {
		if err := get(); err != nil {
			return err
		}
		if _, _, err := lockOnce(); err != nil {
			return err
		}
	}
	var gets, lk, ul, both []time.Duration
	for i := 0; i < *n; i++ {
		t := time.Now()
		if err := get(); err != nil {
			return err
		}
		gets = append(gets, time.Since(t))
	}
	for i := 0; i < *n; i++ {
		a, b, err := lockOnce()
		if err != nil {
			return err
		}
		lk = append(lk, a)
		ul = append(ul, b)
		both = append(both, a+b)
	}
	if err := cpuPerOp("get", *n, get); err != nil {
		return err
	}
	if err := cpuPerOp("lock_unlock", *n, func() error { _, _, err := lockOnce(); return err }); err != nil {
		return err
	}
	report("get", gets, "")
	report("lock", lk, "")
	report("unlock", ul, "")
	report("lock_unlock", both, "")
	return nil
}

func election() error {
	cli, err := newClient()
	if err != nil {
		return err
	}
	defer cli.Close()
	s, err := concurrency.NewSession(cli)
	if err != nil {
		return err
	}
	defer s.Close()
	e := concurrency.NewElection(s, *prefix+"/election")
	once := func() (time.Duration, time.Duration, error) {
		ctx, cancel := bounded()
		defer cancel()
		t0 := time.Now()
		if err := e.Campaign(ctx, "me"); err != nil {
			return 0, 0, err
		}
		t1 := time.Now()
		if err := e.Resign(ctx); err != nil {
			return 0, 0, err
		}
		return t1.Sub(t0), time.Since(t1), nil
	}
	for i := 0; i < 50; i++ {
		if _, _, err := once(); err != nil {
			return err
		}
	}
	var cp, rs, both []time.Duration
	for i := 0; i < *campaigns; i++ {
		a, b, err := once()
		if err != nil {
			return err
		}
		cp = append(cp, a)
		rs = append(rs, b)
		both = append(both, a+b)
	}
	if err := cpuPerOp("campaign_resign", *campaigns, func() error { _, _, err := once(); return err }); err != nil {
		return err
	}
	report("campaign", cp, "")
	report("resign", rs, "")
	report("campaign_resign", both, "")
	return nil
}

func cost() error {
	cli, err := newClient()
	if err != nil {
		return err
	}
	defer cli.Close()
	holder, err := concurrency.NewSession(cli)
	if err != nil {
		return err
	}
	defer holder.Close()
	waiter, err := concurrency.NewSession(cli)
	if err != nil {
		return err
	}
	defer waiter.Close()
	name := *prefix + "/cost"
	mine := concurrency.NewMutex(holder, name)
	theirs := concurrency.NewMutex(waiter, name)
	lock := func(m *concurrency.Mutex) error {
		ctx, cancel := bounded()
		defer cancel()
		return m.Lock(ctx)
	}
	unlock := func(m *concurrency.Mutex) error {
		ctx, cancel := bounded()
		defer cancel()
		return m.Unlock(ctx)
	}
	for _, m := range []*concurrency.Mutex{mine, theirs} {
		if err := lock(m); err != nil {
			return err
		}
		if err := unlock(m); err != nil {
			return err
		}
	}
	const N, H = 20, 10
	acquire, release := newCounters(), newCounters()
	for i := 0; i < N; i++ {
		s0, err := fetchCounters()
		if err != nil {
			return err
		}
		if err := lock(mine); err != nil {
			return err
		}
		s1, err := fetchCounters()
		if err != nil {
			return err
		}
		if err := unlock(mine); err != nil {
			return err
		}
		s2, err := fetchCounters()
		if err != nil {
			return err
		}
		acquire.addDelta(s1, s0)
		release.addDelta(s2, s1)
	}
	queue, handoff := newCounters(), newCounters()
	for i := 0; i < H; i++ {
		if err := lock(mine); err != nil {
			return err
		}
		s0, err := fetchCounters()
		if err != nil {
			return err
		}
		got := make(chan error, 1)
		done := make(chan struct{})
		go func() {
			err := lock(theirs)
			got <- err
			if err == nil {
				select {
				case <-done:
				case <-time.After(wait):
				}
				unlock(theirs)
			}
		}()
		time.Sleep(300 * time.Millisecond) // queued and watching
		s1, err := fetchCounters()
		if err != nil {
			return err
		}
		if err := unlock(mine); err != nil {
			return err
		}
		select {
		case err := <-got:
			if err != nil {
				return err
			}
		case <-time.After(wait):
			return fmt.Errorf("waiter did not get the lock within %v", wait)
		}
		s2, err := fetchCounters()
		if err != nil {
			return err
		}
		close(done)
		time.Sleep(20 * time.Millisecond) // let the waiter release before the next round
		queue.addDelta(s1, s0)
		handoff.addDelta(s2, s1)
	}
	fmt.Printf("RESULT go cost_acquire %s n=%d\n", acquire.perOp(N), N)
	fmt.Printf("RESULT go cost_release %s n=%d\n", release.perOp(N), N)
	fmt.Printf("RESULT go cost_queue %s n=%d\n", queue.perOp(H), H)
	fmt.Printf("RESULT go cost_handoff %s n=%d\n", handoff.perOp(H), H)
	h := func(m string) float64 { return handoff.handled[m]/H - release.handled[m]/N }
	fmt.Printf("RESULT go cost_after_event txn=%.2f range=%.2f delete_range=%.2f requests=%.2f\n",
		h("Txn"), h("Range"), h("DeleteRange"), h("Txn")+h("Range")+h("DeleteRange"))
	return nil
}

func contended() error {
	key := *prefix + "/contended"
	clients := make([]*clientv3.Client, *contenders)
	sessions := make([]*concurrency.Session, *contenders)
	defer func() {
		for i := range clients {
			if sessions[i] != nil {
				sessions[i].Close()
			}
			if clients[i] != nil {
				clients[i].Close()
			}
		}
	}()
	for i := range clients {
		c, err := newClient()
		if err != nil {
			return err
		}
		clients[i] = c
		s, err := concurrency.NewSession(c)
		if err != nil {
			return err
		}
		sessions[i] = s
	}
	var (
		count, violations int64
		holders           int32
		stop              int32
		mu                sync.Mutex
		lastRelease       time.Time
		lastHolder        = -1
		lastToken         int64
		handoffs, waits   []time.Duration
		end               time.Time
		errs              []string
		perWorker         = make([]int64, *contenders)
		wg                sync.WaitGroup
		start             = make(chan struct{})
	)
	fail := func(err error) {
		atomic.StoreInt32(&stop, 1)
		mu.Lock()
		errs = append(errs, err.Error())
		mu.Unlock()
	}
	for w := 0; w < *contenders; w++ {
		wg.Add(1)
		go func(w int) {
			defer wg.Done()
			m := concurrency.NewMutex(sessions[w], key)
			<-start
			for atomic.LoadInt32(&stop) == 0 {
				ctx, cancel := bounded()
				t0 := time.Now()
				if err := m.Lock(ctx); err != nil {
					cancel()
					fail(fmt.Errorf("worker %d: lock: %v", w, err))
					return
				}
				acq := time.Now()
				if atomic.LoadInt64(&count) >= int64(*total) {
					atomic.StoreInt32(&stop, 1)
					m.Unlock(ctx)
					cancel()
					return
				}
				if atomic.AddInt32(&holders, 1) != 1 {
					atomic.AddInt64(&violations, 1)
				}
				token := m.Header().Revision // the revision at which we became owner
				mu.Lock()
				if token <= lastToken {
					violations++
				}
				lastToken = token
				if lastHolder >= 0 && lastHolder != w {
					handoffs = append(handoffs, acq.Sub(lastRelease))
				}
				waits = append(waits, acq.Sub(t0))
				mu.Unlock()
				c := atomic.AddInt64(&count, 1)
				perWorker[w]++
				atomic.AddInt32(&holders, -1)
				mu.Lock()
				lastHolder, lastRelease = w, time.Now()
				mu.Unlock()
				err := m.Unlock(ctx)
				cancel()
				if c == int64(*total) {
					mu.Lock()
					end = time.Now()
					mu.Unlock()
				}
				if err != nil {
					fail(fmt.Errorf("worker %d: unlock: %v", w, err))
					return
				}
			}
		}(w)
	}
	before, beforeErr := fetchCounters()
	t0 := time.Now()
	close(start)
	finished := make(chan struct{})
	go func() { wg.Wait(); close(finished) }()
	select {
	case <-finished:
	case <-time.After(time.Minute + 2*wait + time.Duration(*total)*20*time.Millisecond):
		fail(fmt.Errorf("workers still running at the deadline"))
	}
	after, afterErr := fetchCounters()
	mu.Lock()
	defer mu.Unlock()
	if end.IsZero() {
		end = time.Now()
	}
	el := end.Sub(t0)
	got := atomic.LoadInt64(&count)
	split := make([]string, len(perWorker))
	for i, c := range perWorker {
		split[i] = strconv.FormatInt(c, 10)
	}
	fmt.Printf("RESULT go contended throughput_acq_s=%.0f acquisitions=%d contenders=%d elapsed_ms=%d violations=%d per_worker=%s errors=%d\n",
		float64(got)/el.Seconds(), got, *contenders, el.Milliseconds(), atomic.LoadInt64(&violations), strings.Join(split, "/"), len(errs))
	if beforeErr == nil && afterErr == nil && got > 0 {
		// Every request of the run (joins, waits, reads, releases) per acquisition.
		cost := newCounters()
		cost.addDelta(after, before)
		fmt.Printf("RESULT go contended_cost %s n=%d\n", cost.perOp(int(got)), got)
	}
	report("handoff", handoffs, fmt.Sprintf("contenders=%d %s", *contenders, tail(handoffs)))
	report("lock_wait", waits, fmt.Sprintf("contenders=%d", *contenders))
	for _, e := range errs {
		fmt.Fprintf(os.Stderr, "gocompare: contended: %s\n", e)
	}
	if len(errs) > 0 {
		return fmt.Errorf("contended run had %d errors", len(errs))
	}
	return nil
}

// rangeCost measures the ordered reads both recipes use to find their place in line against
// the number of keys under the prefix, in latency and in etcd's CPU per read (from its
// process_cpu_seconds_total): the newest two keys created up to a revision (Go:
// waitDeletes; etcd-sync: the read after its lookout's delete), the newest three (the read
// in etcd-sync's join Txn), and for comparison the same limit unsorted (in key order) and a
// count. etcd 3.4-3.7 ignore the limit and read every key under the prefix when a range is
// sorted or filtered by create revision (etcdserver/apply.go, applierV3backend.Range): 3.4
// reads each from bbolt, 3.5+ from its index; an unsorted limited range reads only the
// limit (it still walks the index to count).
func rangeCost() error {
	cli, err := newClient()
	if err != nil {
		return err
	}
	defer cli.Close()
	const reads = 500
	for _, keys := range []int{3, 17, 257, 1025} {
		pfx := fmt.Sprintf("%s/rangecost/%d/", *prefix, keys)
		var last int64
		for i := 0; i < keys; i++ {
			ctx, cancel := bounded()
			r, err := cli.Put(ctx, fmt.Sprintf("%s%016x", pfx, i*7919), "")
			cancel()
			if err != nil {
				return err
			}
			last = r.Header.Revision
		}
		measure := func(figure string, opts ...clientv3.OpOption) error {
			var v []time.Duration
			before, err := fetchCounters()
			if err != nil {
				return err
			}
			for i := 0; i < reads; i++ {
				ctx, cancel := bounded()
				t := time.Now()
				_, err := cli.Get(ctx, pfx, opts...)
				d := time.Since(t)
				cancel()
				if err != nil {
					return err
				}
				v = append(v, d)
			}
			after, err := fetchCounters()
			if err != nil {
				return err
			}
			cpu := (after.plain["process_cpu_seconds_total"] - before.plain["process_cpu_seconds_total"]) * 1e6 / reads
			report(fmt.Sprintf("%s_keys_%d", figure, keys), v, fmt.Sprintf("keys=%d etcd_cpu_us=%.0f", keys, cpu))
			return nil
		}
		joinRead := []clientv3.OpOption{clientv3.WithPrefix(), clientv3.WithKeysOnly(), clientv3.WithLimit(3),
			clientv3.WithSort(clientv3.SortByCreateRevision, clientv3.SortDescend)}
		if err := measure("range_sorted", append(clientv3.WithLastCreate(), clientv3.WithMaxCreateRev(last), clientv3.WithLimit(2))...); err != nil {
			return err
		}
		if err := measure("range_join", joinRead...); err != nil {
			return err
		}
		if err := measure("range_unsorted", clientv3.WithPrefix(), clientv3.WithKeysOnly(), clientv3.WithLimit(3)); err != nil {
			return err
		}
		if err := measure("range_count", clientv3.WithPrefix(), clientv3.WithCountOnly()); err != nil {
			return err
		}
		ctx, cancel := bounded()
		_, err = cli.Delete(ctx, pfx, clientv3.WithPrefix())
		cancel()
		if err != nil {
			return err
		}
	}
	return nil
}

func main() {
	flag.Parse()
	time.AfterFunc(*timeout, func() {
		fmt.Fprintf(os.Stderr, "gocompare: aborted after %v (watchdog)\n", *timeout)
		os.Exit(3)
	})
	wanted := map[string]bool{}
	for _, p := range strings.Split(*only, ",") {
		if p = strings.TrimSpace(p); p != "" {
			wanted[p] = true
		}
	}
	fmt.Printf("gocompare: go.etcd.io/etcd/clientv3/concurrency against %s (n=%d, contenders=%d, total=%d, campaigns=%d)\n",
		*endpoints, *n, *contenders, *total, *campaigns)
	failed := 0
	for _, phase := range []struct {
		name string
		run  func() error
	}{{"uncontended", uncontended}, {"election", election}, {"cost", cost}, {"contended", contended}, {"rows", rows}, {"rangecost", rangeCost}, {"stm", stmRows}} {
		if len(wanted) > 0 && !wanted[phase.name] && !(phase.name == "rows" && wanted["contended"]) {
			continue
		}
		if phase.name == "rows" && len(rowCounts()) == 0 {
			continue
		}
		t := time.Now()
		fmt.Fprintf(os.Stderr, "gocompare: %s ...\n", phase.name)
		if err := phase.run(); err != nil {
			fmt.Fprintf(os.Stderr, "gocompare: %s failed: %v\n", phase.name, err)
			fmt.Printf("RESULT go %s error=%q\n", phase.name, err.Error())
			failed++
		}
		fmt.Fprintf(os.Stderr, "gocompare: %s took %.1f s\n", phase.name, time.Since(t).Seconds())
	}
	if failed > 0 {
		os.Exit(1)
	}
}
