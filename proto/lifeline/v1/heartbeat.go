package lifelinev1

import (
	"fmt"
	"time"
)

// The heartbeat contract [P-HB-3]: an agent sends a heartbeat every interval, says the interval in its birth,
// and the controller takes its node as silent after SilentIntervals of them without one.
const (
	DefaultHeartbeatInterval = time.Second
	// MinHeartbeatInterval bounds what a node may make the controller ingest; MaxHeartbeatInterval, how long a
	// dead node may pass for alive (three intervals).
	MinHeartbeatInterval = 250 * time.Millisecond
	MaxHeartbeatInterval = 30 * time.Second
	SilentIntervals      = 3
)

// CheckHeartbeatInterval refuses an interval outside the contract's bounds, naming them.
func CheckHeartbeatInterval(d time.Duration) error {
	if d < MinHeartbeatInterval || d > MaxHeartbeatInterval {
		return fmt.Errorf("heartbeat interval %v is outside [%v, %v]", d, MinHeartbeatInterval, MaxHeartbeatInterval)
	}
	return nil
}

// SilentAfter is how long a node born with b may go without a heartbeat before it is silent: three of its
// intervals, or of the default when it says none or one outside the bounds (an older agent, or a forged birth).
func SilentAfter(b *NodeBirth) time.Duration {
	d := time.Duration(b.GetHeartbeatIntervalMillis()) * time.Millisecond
	if CheckHeartbeatInterval(d) != nil {
		d = DefaultHeartbeatInterval
	}
	return SilentIntervals * d
}
