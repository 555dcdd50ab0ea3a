package memlimit

import (
	"math"
	"runtime/debug"
	"testing"
	"testing/fstest"
)

func TestContainerLimit(t *testing.T) {
	cases := []struct {
		name  string
		files map[string]string
		want  int64
		err   bool
	}{{
		name:  "v2 in a container's namespace",
		files: map[string]string{"proc/self/cgroup": "0::/\n", "sys/fs/cgroup/memory.max": "268435456\n"},
		want:  256 << 20,
	}, {
		name: "v2 with the group's own path",
		files: map[string]string{"proc/self/cgroup": "0::/kubepods/pod1/c1\n",
			"sys/fs/cgroup/kubepods/pod1/c1/memory.max": "104857600"},
		want: 100 << 20,
	}, {
		name:  "v2 without a limit",
		files: map[string]string{"proc/self/cgroup": "0::/\n", "sys/fs/cgroup/memory.max": "max\n"},
	}, {
		name: "v1 memory controller",
		files: map[string]string{"proc/self/cgroup": "5:devices:/\n4:memory:/docker/abc\n0::/\n",
			"sys/fs/cgroup/memory/docker/abc/memory.limit_in_bytes": "335544320\n"},
		want: 320 << 20,
	}, {
		name: "v1 without a limit",
		files: map[string]string{"proc/self/cgroup": "4:cpu,memory:/\n",
			"sys/fs/cgroup/memory/memory.limit_in_bytes": "9223372036854771712\n"},
	}, {
		name:  "no cgroup files mounted",
		files: map[string]string{"proc/self/cgroup": "0::/\n"},
	}, {
		name:  "garbage in the limit file",
		files: map[string]string{"proc/self/cgroup": "0::/\n", "sys/fs/cgroup/memory.max": "lots\n"},
		err:   true,
	}, {
		name:  "no /proc",
		files: map[string]string{},
		err:   true,
	}}
	for _, tc := range cases {
		t.Run(tc.name, func(t *testing.T) {
			root := fstest.MapFS{}
			for name, data := range tc.files {
				root[name] = &fstest.MapFile{Data: []byte(data)}
			}
			got, err := ContainerLimit(root)
			if (err != nil) != tc.err || got != tc.want {
				t.Errorf("ContainerLimit = %d, %v; want %d, error %v", got, err, tc.want, tc.err)
			}
		})
	}
}

func TestSetLeavesAnExplicitGOMEMLIMITAlone(t *testing.T) {
	t.Setenv("GOMEMLIMIT", "1GiB")
	root := fstest.MapFS{"proc/self/cgroup": {Data: []byte("0::/\n")}, "sys/fs/cgroup/memory.max": {Data: []byte("1048576")}}
	if got, why, err := Set(root, 0.9); got != 0 || err != nil || why != "GOMEMLIMIT is set" {
		t.Errorf("Set = %d, %q, %v", got, why, err)
	}
}

func TestSetUsesTheFraction(t *testing.T) {
	limit256 := int64(256 << 20)
	t.Setenv("GOMEMLIMIT", "")
	root := fstest.MapFS{"proc/self/cgroup": {Data: []byte("0::/\n")}, "sys/fs/cgroup/memory.max": {Data: []byte("268435456")}}
	t.Cleanup(func() { debug.SetMemoryLimit(math.MaxInt64) })
	got, _, err := Set(root, 0.9)
	if err != nil || got != int64(float64(limit256)*0.9) || debug.SetMemoryLimit(-1) != got {
		t.Errorf("Set = %d, %v; want 90%% of 256 MiB", got, err)
	}
}
