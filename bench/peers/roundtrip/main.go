// round-trip: the idle and busy round trip of `SELECT 1` from Go (pgx), for bench/round_trip.py.
//
//	cd bench/peers/roundtrip && go build -o round-trip . && ./round-trip POSTGRES_URL SAMPLES
//
// Prints one line per case, "name p50_ms p90_ms", the same loop as the Python cases.
package main

import (
	"context"
	"fmt"
	"os"
	"sort"
	"strconv"
	"time"

	"github.com/jackc/pgx/v5"
)

func main() {
	if len(os.Args) != 3 {
		fmt.Fprintln(os.Stderr, "usage: round-trip POSTGRES_URL SAMPLES")
		os.Exit(2)
	}
	samples, err := strconv.Atoi(os.Args[2])
	if err != nil || samples < 10 {
		fmt.Fprintln(os.Stderr, "SAMPLES: a number of at least 10")
		os.Exit(2)
	}
	ctx := context.Background()
	conn, err := pgx.Connect(ctx, os.Args[1])
	if err != nil {
		fmt.Fprintln(os.Stderr, err)
		os.Exit(1)
	}
	defer conn.Close(ctx)
	for _, c := range []struct {
		name  string
		pause time.Duration
	}{{"go pgx, idle", 50 * time.Millisecond}, {"go pgx, busy", 0}} {
		times := make([]float64, 0, samples)
		for i := 0; i < samples; i++ {
			time.Sleep(c.pause)
			started := time.Now()
			var one int
			if err := conn.QueryRow(ctx, "SELECT 1").Scan(&one); err != nil {
				fmt.Fprintln(os.Stderr, err)
				os.Exit(1)
			}
			times = append(times, float64(time.Since(started).Nanoseconds())/1e6)
		}
		sort.Float64s(times)
		fmt.Printf("%s %.3f %.3f\n", c.name, times[len(times)/2], times[len(times)*9/10])
	}
}
