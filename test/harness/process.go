package harness

import (
	"bytes"
	"errors"
	"fmt"
	"math/rand/v2"
	"net"
	"os"
	"os/exec"
	"path/filepath"
	"strconv"
	"strings"
	"syscall"
	"testing"
	"time"
)

// Process is a child process of a control plane: a control-plane binary, or anything a test or the demo
// launches beside it. Its output goes to a log file in the instance's directory, so a failed test can point at it.
type Process struct {
	name    string
	cmd     *exec.Cmd
	logPath string
	logFile *os.File
	exited  chan struct{} // closed once the process has been reaped
	waitErr error         // valid after exited is closed
}

// startComponent starts binary with args. The first component becomes the leader of a new process group and
// every later one joins it (pgid != 0), so one signal reaches them all. Each child also gets SIGKILL when this
// process dies, so a panic or a killed test binary leaves nothing behind.
func startComponent(name, binary string, args, env []string, logDir string, pgid int) (*Process, error) {
	logPath := filepath.Join(logDir, name+".log")
	logFile, err := os.OpenFile(logPath, os.O_CREATE|os.O_WRONLY|os.O_APPEND, 0o644)
	if err != nil {
		return nil, fmt.Errorf("creating log file for %s: %w", name, err)
	}
	cmd := exec.Command(binary, args...)
	cmd.Env = env
	cmd.Stdout = logFile
	cmd.Stderr = logFile
	cmd.SysProcAttr = &syscall.SysProcAttr{Setpgid: true, Pgid: pgid, Pdeathsig: syscall.SIGKILL}
	if err := cmd.Start(); err != nil {
		logFile.Close()
		return nil, fmt.Errorf("starting %s (%s): %w", name, binary, err)
	}
	c := &Process{name: name, cmd: cmd, logPath: logPath, logFile: logFile, exited: make(chan struct{})}
	go func() {
		c.waitErr = cmd.Wait()
		logFile.Close()
		close(c.exited)
	}()
	return c, nil
}

// Exited reports nil while the process runs, and once it ended an error naming the component and quoting the end of its log when it has exited.
func (c *Process) Exited() error {
	select {
	case <-c.exited:
		return fmt.Errorf("%s exited (%v); last lines of %s:\n%s", c.name, c.waitErr, c.logPath, tail(c.logPath, 15))
	default:
		return nil
	}
}

// Stop asks the process to end and kills it after grace.
func (c *Process) Stop(grace time.Duration) {
	select {
	case <-c.exited:
		return
	default:
	}
	_ = c.cmd.Process.Signal(syscall.SIGTERM)
	select {
	case <-c.exited:
	case <-time.After(grace):
		_ = c.cmd.Process.Kill()
		<-c.exited
	}
}

// LogPath is the file the process writes to.
func (c *Process) LogPath() string { return c.logPath }

// tail returns the last n lines of a file, for error messages.
func tail(path string, n int) string {
	data, err := os.ReadFile(path)
	if err != nil {
		return "(no log: " + err.Error() + ")"
	}
	lines := strings.Split(string(bytes.TrimRight(data, "\n")), "\n")
	if len(lines) > n {
		lines = lines[len(lines)-n:]
	}
	return "  " + strings.Join(lines, "\n  ")
}

// findBinary returns the path of name in dir, or an error that says how to get it.
func findBinary(dir, name string) (string, error) {
	path := filepath.Join(dir, name)
	info, err := os.Stat(path)
	if errors.Is(err, os.ErrNotExist) {
		return "", fmt.Errorf("%s not found in %s: run `make tools` to build it", name, dir)
	}
	if err != nil {
		return "", fmt.Errorf("looking for %s: %w", name, err)
	}
	if info.IsDir() || info.Mode()&0o111 == 0 {
		return "", fmt.Errorf("%s is not an executable file", path)
	}
	return path, nil
}

// FreeAddr returns a loopback address whose port is free right now, for a process the test starts.
func FreeAddr(t testing.TB) string {
	t.Helper()
	addr, err := FreeLoopbackAddr()
	if err != nil {
		t.Fatal(err)
	}
	return addr
}

// FreeLoopbackAddr returns a loopback address whose port is free right now, picked below the kernel's ephemeral
// range (32768 and up): a port the kernel hands out for ":0" is also one it hands to the next outgoing connection
// of any process, which may take it before the process it was meant for binds it.
func FreeLoopbackAddr() (string, error) {
	var last error
	for range 100 {
		port := 20000 + rand.IntN(12000)
		l, err := net.Listen("tcp", net.JoinHostPort("127.0.0.1", strconv.Itoa(port)))
		if err != nil {
			last = err
			continue
		}
		addr := l.Addr().String()
		l.Close()
		return addr, nil
	}
	return "", fmt.Errorf("no free loopback port below 32000: %w", last)
}
