package cluster

// Pid is the operating system's id of the process, so a benchmark can read its CPU time and memory from /proc.
func (c *Process) Pid() int { return c.cmd.Process.Pid }
