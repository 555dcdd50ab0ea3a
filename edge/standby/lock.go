package standby

import (
	"context"
	"errors"
	"fmt"
	"os"
	"path/filepath"
	"sync/atomic"
	"syscall"
	"time"

	"github.com/go-logr/logr"
)

// NodeLock makes the node's agent pod and its standby act one at a time on the node's state: the journal, the
// birth sequence, the stand-ins and the report port are one agent's. The agent pod holds the lock for its life;
// the standby takes it only while no agent pod waits for it.
type NodeLock struct {
	// Dir is the agent's state directory.
	Dir string
}

const (
	lockFile    = "agent.lock"
	waitingFile = "agent-pod-waiting"
)

// Hold takes the lock for the agent pod, waiting while the standby, or an older agent pod, acts: it sees the
// pod waiting and gives way. The lock is the agent pod's until release, or until the process ends.
func (l NodeLock) Hold(ctx context.Context, log logr.Logger) (release func(), err error) {
	waiting := filepath.Join(l.Dir, waitingFile)
	if err := os.WriteFile(waiting, nil, 0o600); err != nil {
		return nil, fmt.Errorf("saying the agent pod waits for the node: %w", err)
	}
	defer os.Remove(waiting)
	return l.wait(ctx, log, l.try, "waiting for the node's standby agent, or the agent pod it replaces, to give way")
}

// Serve runs run while this agent pod holds the node, and hands the node over when another agent pod asks for
// it. An update of the DaemonSet starts the new pod beside the old one (maxSurge), and the new one waits for the
// lock: the old one ends run (its reports journaled, its listeners closed), releases the lock and waits without
// asking, to take the node again should the new one stop first. Serve returns when ctx ends, or run fails.
func (l NodeLock) Serve(ctx context.Context, interval time.Duration, log logr.Logger, run func(ctx context.Context) error) error {
	release, err := l.Hold(ctx, log)
	for {
		if err != nil {
			if ctx.Err() != nil {
				return nil
			}
			return err
		}
		runCtx, stop := context.WithCancel(ctx)
		var asked atomic.Bool
		go func() {
			tick := time.NewTicker(interval)
			defer tick.Stop()
			for {
				select {
				case <-runCtx.Done():
					return
				case <-tick.C:
					if l.PodWaiting() {
						asked.Store(true)
						stop()
						return
					}
				}
			}
		}()
		err = run(runCtx)
		stop()
		release()
		if !asked.Load() || ctx.Err() != nil {
			return err
		}
		log.Info("another agent pod asks for the node: handed over; this one takes it again if the other stops first")
		release, err = l.wait(ctx, log, l.TryUnasked, "waiting for the node while the new agent pod holds it")
	}
}

// wait takes the lock with try as soon as it can, logging why once.
func (l NodeLock) wait(ctx context.Context, log logr.Logger, try func() (func(), bool, error), why string) (release func(), err error) {
	logged := false
	for {
		release, ok, err := try()
		if err != nil || ok {
			return release, err
		}
		if !logged {
			log.Info(why)
			logged = true
		}
		select {
		case <-ctx.Done():
			return nil, ctx.Err()
		case <-time.After(100 * time.Millisecond):
		}
	}
}

// PodWaiting tells whether an agent pod waits for the lock.
func (l NodeLock) PodWaiting() bool {
	_, err := os.Stat(filepath.Join(l.Dir, waitingFile))
	return err == nil
}

// TryUnasked takes the lock if no agent pod holds it or waits for it: the standby's way, and an old agent pod's
// once it handed the node over.
func (l NodeLock) TryUnasked() (release func(), ok bool, err error) {
	if l.PodWaiting() {
		return nil, false, nil
	}
	return l.try()
}

// try takes the lock if it is free. An flock dies with its holder, so a crashed agent never keeps the node.
func (l NodeLock) try() (func(), bool, error) {
	f, err := os.OpenFile(filepath.Join(l.Dir, lockFile), os.O_CREATE|os.O_RDWR, 0o600)
	if err != nil {
		return nil, false, fmt.Errorf("opening the node's agent lock: %w", err)
	}
	if err := syscall.Flock(int(f.Fd()), syscall.LOCK_EX|syscall.LOCK_NB); err != nil {
		f.Close()
		if errors.Is(err, syscall.EWOULDBLOCK) {
			return nil, false, nil
		}
		return nil, false, fmt.Errorf("taking the node's agent lock: %w", err)
	}
	return func() { f.Close() }, true, nil
}
