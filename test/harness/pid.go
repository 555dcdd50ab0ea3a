package harness

// Pid is the operating system's id of the process, so a benchmark can read its CPU time and memory from /proc.
func (c *Process) Pid() int { return c.cmd.Process.Pid }

// Name is the component's name, as its log file is named.
func (c *Process) Name() string { return c.name }

// Components returns every process launched so far, the control plane's first, so a benchmark can tell what
// each used of the machine.
func (cp *ControlPlane) Components() []*Process {
	cp.mu.Lock()
	defer cp.mu.Unlock()
	return append([]*Process(nil), cp.components...)
}
