// Enqueues queueworker tasks from Go with pgx, through the SQL producer API (docs/producers.md):
// one task with queueworker.enqueue, two more with queueworker.enqueue_many, in one transaction.
// With -wait it then reads each back with queueworker.task_status until it has finished, as a
// producer that needs the result would.
//
//	DATABASE_URL=postgresql://billing_app@db/app go run . -wait
package main

import (
	"context"
	"errors"
	"flag"
	"fmt"
	"os"
	"strings"
	"time"

	"github.com/jackc/pgx/v5"
	"github.com/jackc/pgx/v5/pgconn"
)

type spec struct {
	Task        string         `json:"task"`
	Queue       string         `json:"queue,omitempty"`
	Payload     map[string]any `json:"payload,omitempty"`
	Delay       float64        `json:"delay,omitempty"`
	MaxAttempts int            `json:"max_attempts,omitempty"`
}

func enqueue(ctx context.Context, conn *pgx.Conn) ([]int64, error) {
	tx, err := conn.Begin(ctx)
	if err != nil {
		return nil, err
	}
	defer tx.Rollback(ctx) // a no-op after Commit
	var id int64
	// Named arguments are TaskSpec's fields; a Go map is sent as JSON.
	err = tx.QueryRow(ctx, `SELECT queueworker.enqueue('emails.send_welcome', $1, queue => 'emails', priority => 5,
	                                                   key => 'tenant-7', dedupe_key => 'welcome-42')`,
		map[string]any{"user_id": 42}).Scan(&id)
	if err != nil {
		return nil, err
	}
	var more []int64
	err = tx.QueryRow(ctx, `SELECT queueworker.enqueue_many($1)`, []spec{
		{Task: "emails.send_welcome", Queue: "emails", Payload: map[string]any{"user_id": 43}},
		{Task: "emails.send_welcome", Queue: "emails", Payload: map[string]any{"user_id": 44}, Delay: 0.5, MaxAttempts: 3},
	}).Scan(&more)
	if err != nil {
		return nil, err
	}
	return append([]int64{id}, more...), tx.Commit(ctx) // the workers are woken when the tasks commit
}

func waitFor(ctx context.Context, conn *pgx.Conn, id int64, timeout time.Duration) (string, []byte, error) {
	deadline := time.Now().Add(timeout)
	for {
		var state string
		var attempts int32
		var result, failure []byte
		err := conn.QueryRow(ctx, `SELECT state, attempts, result, error FROM queueworker.task_status($1)`, id).
			Scan(&state, &attempts, &result, &failure)
		if errors.Is(err, pgx.ErrNoRows) {
			return "", nil, fmt.Errorf("no task %d", id)
		} else if err != nil {
			return "", nil, err
		}
		if state == "succeeded" || state == "failed" || state == "cancelled" {
			return state, result, nil
		}
		if time.Now().After(deadline) {
			return "", nil, fmt.Errorf("task %d is still %s", id, state)
		}
		time.Sleep(200 * time.Millisecond)
	}
}

func main() {
	wait := flag.Bool("wait", false, "wait for the tasks to finish and print their results")
	flag.Parse()
	ctx := context.Background()
	conn, err := pgx.Connect(ctx, os.Getenv("DATABASE_URL"))
	if err != nil {
		fail(err)
	}
	defer conn.Close(ctx)
	ids, err := enqueue(ctx, conn)
	if err != nil {
		fail(err)
	}
	words := make([]string, len(ids))
	for i, id := range ids {
		words[i] = fmt.Sprint(id)
	}
	fmt.Println("enqueued", strings.Join(words, " "))
	if *wait {
		for _, id := range ids {
			state, result, err := waitFor(ctx, conn, id, time.Minute)
			if err != nil {
				fail(err)
			}
			fmt.Println(id, state, string(result))
		}
	}
}

// fail prints one line: pgconn's errors carry the SQLSTATE (22023 a refused argument, 42501 a queue
// this login may not use).
func fail(err error) {
	var pgErr *pgconn.PgError
	if errors.As(err, &pgErr) {
		fmt.Fprintf(os.Stderr, "enqueue failed: %s (SQLSTATE %s)\n", pgErr.Message, pgErr.Code)
	} else {
		fmt.Fprintf(os.Stderr, "enqueue failed: %v\n", err)
	}
	os.Exit(1)
}
