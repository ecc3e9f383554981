// River harness for the benchmark: `install` (migrations), `work` (one worker process) or `produce`
// (River's client API, Insert/InsertMany, driven over stdin: each line is a count of `record` jobs
// to insert, each stamped just before the call; "ready" once connected, "ok" after each call).
// Build: cd bench/peers/river && go build -o river-bench .
// FetchCooldown is 1 ms (flag --fetch-cooldown); everything else is River's default.
package main

import (
	"bufio"
	"context"
	"flag"
	"fmt"
	"os"
	"os/signal"
	"strconv"
	"sync"
	"syscall"
	"time"

	"github.com/jackc/pgx/v5/pgxpool"
	"github.com/riverqueue/river"
	"github.com/riverqueue/river/riverdriver/riverpgxv5"
	"github.com/riverqueue/river/rivermigrate"
)

type NoopArgs struct{}

func (NoopArgs) Kind() string { return "noop" }

type NoopWorker struct{ river.WorkerDefaults[NoopArgs] }

func (w *NoopWorker) Work(ctx context.Context, job *river.Job[NoopArgs]) error { return nil }

type RecordArgs struct {
	T float64 `json:"t"`
}

func (RecordArgs) Kind() string { return "record" }

type RecordWorker struct {
	river.WorkerDefaults[RecordArgs]
	mu  sync.Mutex
	out *os.File
}

func (w *RecordWorker) Work(ctx context.Context, job *river.Job[RecordArgs]) error {
	now := nowSeconds()
	if w.out != nil {
		w.mu.Lock()
		fmt.Fprintf(w.out, "%.3f\n", (now-job.Args.T)*1000)
		w.mu.Unlock()
	}
	return nil
}

func nowSeconds() float64 { return float64(time.Now().UnixNano()) / 1e9 }

// The client sends at most one insert NOTIFY per queue per FetchCooldown, so it is given the workers'.
func produce(ctx context.Context, pool *pgxpool.Pool, cooldown time.Duration) {
	client, err := river.NewClient(riverpgxv5.New(pool), &river.Config{FetchCooldown: cooldown}) // insert-only
	if err != nil {
		panic(err)
	}
	fmt.Println("ready")
	lines := bufio.NewScanner(os.Stdin)
	for lines.Scan() {
		count, err := strconv.Atoi(lines.Text())
		if err != nil {
			panic(err)
		}
		if count == 1 {
			_, err = client.Insert(ctx, RecordArgs{T: nowSeconds()}, nil)
		} else {
			params := make([]river.InsertManyParams, count)
			for i := range params {
				params[i] = river.InsertManyParams{Args: RecordArgs{T: nowSeconds()}}
			}
			_, err = client.InsertMany(ctx, params)
		}
		if err != nil {
			panic(err)
		}
		fmt.Println("ok")
	}
}

func main() {
	if len(os.Args) < 2 {
		fmt.Fprintln(os.Stderr, "usage: river-bench install|work|produce --dsn DSN [--concurrency N]")
		os.Exit(2)
	}
	fs := flag.NewFlagSet(os.Args[1], flag.ExitOnError)
	dsn := fs.String("dsn", "", "Postgres URL")
	concurrency := fs.Int("concurrency", 100, "MaxWorkers of the default queue")
	// River's default FetchCooldown (100 ms) caps a 100-slot client at 1,000 jobs/s; 1 ms lifts that.
	cooldown := fs.Duration("fetch-cooldown", time.Millisecond, "river.Config.FetchCooldown")
	_ = fs.Parse(os.Args[2:])
	ctx := context.Background()
	pool, err := pgxpool.New(ctx, *dsn)
	if err != nil {
		panic(err)
	}
	defer pool.Close()
	if os.Args[1] == "install" {
		migrator, err := rivermigrate.New(riverpgxv5.New(pool), nil)
		if err != nil {
			panic(err)
		}
		if _, err := migrator.Migrate(ctx, rivermigrate.DirectionUp, nil); err != nil {
			panic(err)
		}
		return
	}
	if os.Args[1] == "produce" {
		produce(ctx, pool, *cooldown)
		return
	}
	record := &RecordWorker{}
	if path := os.Getenv("BENCH_LAT_FILE"); path != "" {
		record.out, err = os.OpenFile(fmt.Sprintf("%s.%d", path, os.Getpid()), os.O_CREATE|os.O_WRONLY|os.O_APPEND, 0o644)
		if err != nil {
			panic(err)
		}
	}
	workers := river.NewWorkers()
	river.AddWorker(workers, &NoopWorker{})
	river.AddWorker(workers, record)
	client, err := river.NewClient(riverpgxv5.New(pool), &river.Config{
		Queues:        map[string]river.QueueConfig{river.QueueDefault: {MaxWorkers: *concurrency}},
		Workers:       workers,
		FetchCooldown: *cooldown,
	})
	if err != nil {
		panic(err)
	}
	if err := client.Start(ctx); err != nil {
		panic(err)
	}
	sig := make(chan os.Signal, 1)
	signal.Notify(sig, syscall.SIGTERM, syscall.SIGINT)
	<-sig
	stopCtx, cancel := context.WithTimeout(ctx, 5*time.Second)
	defer cancel()
	_ = client.Stop(stopCtx)
}
