package logflags

import (
	"bytes"
	"encoding/json"
	"errors"
	"flag"
	"io"
	"strings"
	"testing"
)

func TestLevelsByNameAndOneFormat(t *testing.T) {
	tests := []struct {
		args       []string
		wantLevels []string // of an Info, a V(2), a V(4) and an Error line, those written
		wantErr    string
	}{
		{args: nil, wantLevels: []string{"info", "error"}},
		{args: []string{"--log-level=debug"}, wantLevels: []string{"info", "debug", "error"}},
		{args: []string{"--log-level=trace"}, wantLevels: []string{"info", "debug", "trace", "error"}},
		{args: []string{"--log-level=2"}, wantLevels: []string{"info", "debug", "error"}},
		{args: []string{"--log-level=error"}, wantLevels: []string{"error"}},
		{args: []string{"--log-level=loud"}, wantErr: `--log-level "loud"`},
		{args: []string{"--log-level=11"}, wantErr: `--log-level "11"`},
		{args: []string{"--log-format=xml"}, wantErr: `--log-format "xml"`},
	}
	for _, tt := range tests {
		t.Run(strings.Join(tt.args, " "), func(t *testing.T) {
			fs := flag.NewFlagSet("d", flag.ContinueOnError)
			fs.SetOutput(io.Discard)
			var o Options
			Bind(fs, &o)
			if err := fs.Parse(tt.args); err != nil {
				t.Fatal(err)
			}
			var out bytes.Buffer
			log, err := o.Logger(&out)
			if tt.wantErr != "" {
				if err == nil || !strings.Contains(err.Error(), tt.wantErr) {
					t.Fatalf("error %v, want one naming %s", err, tt.wantErr)
				}
				return
			}
			if err != nil {
				t.Fatal(err)
			}
			log = log.WithName("part")
			log.Info("i", "k", "v")
			log.V(2).Info("d")
			log.V(4).Info("t")
			log.Error(errors.New("boom"), "e")
			var levels []string
			for _, line := range strings.Split(strings.TrimSpace(out.String()), "\n") {
				var rec map[string]any
				if err := json.Unmarshal([]byte(line), &rec); err != nil {
					t.Fatalf("not a JSON line: %q", line)
				}
				for _, key := range []string{"time", "level", "msg", "logger"} {
					if rec[key] == nil {
						t.Errorf("line %q lacks %s", line, key)
					}
				}
				levels = append(levels, rec["level"].(string))
			}
			if strings.Join(levels, ",") != strings.Join(tt.wantLevels, ",") {
				t.Errorf("levels %v, want %v", levels, tt.wantLevels)
			}
		})
	}
}
