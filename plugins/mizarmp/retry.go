package main

import (
	"context"
	"errors"
	"log/slog"
	"time"

	"kurma.dev/kurma/pkg/kerrors"
)

// Backoff between retries of a transient controller error: it starts
// short (a restarting controller is back within a second) and is capped so
// that the plugin notices a recovered controller soon.
const (
	retryFirstBackoff = 50 * time.Millisecond
	retryMaxBackoff   = time.Second
)

// transient reports whether err is a controller failure worth retrying: the
// controller could not be reached or dropped the connection (Unavailable:
// refused, reset, unexpected EOF), or it answered 500, 502 or 503. Answers
// about the request itself (4xx), the request's own timeout and the caller's
// cancellation are final.
func transient(err error) bool {
	var se *httpStatusError
	if errors.As(err, &se) {
		return se.status == 500 || se.status == 502 || se.status == 503
	}
	return errors.Is(err, kerrors.Unavailable)
}

// retry runs call, each attempt under its own timeout, until it succeeds,
// fails for good, or the invocation's retry budget (timeouts.retry,
// counted from the start of the verb) is spent; it then returns the last
// error. Only idempotent calls go through it: a create whose answer was
// lost is handled by createPort, which adopts the port it made.
func (inv *invocation) retry(ctx context.Context, what string, timeout time.Duration, call func(context.Context) error) error {
	backoff := retryFirstBackoff
	for attempt := 1; ; attempt++ {
		rctx, cancel := context.WithTimeout(ctx, timeout)
		err := call(rctx)
		cancel()
		if err == nil || !transient(err) || !inv.wait(ctx, backoff) {
			return err
		}
		slog.Debug("retrying after a transient controller error", "call", what, "attempt", attempt, "err", err)
		backoff = min(2*backoff, retryMaxBackoff)
	}
}

// wait sleeps d before a retry and reports whether the retry may run: the
// budget is not spent by then and ctx is not done.
func (inv *invocation) wait(ctx context.Context, d time.Duration) bool {
	if time.Now().Add(d).After(inv.retryUntil) {
		return false
	}
	t := time.NewTimer(d)
	defer t.Stop()
	select {
	case <-ctx.Done():
		return false
	case <-t.C:
		return true
	}
}
