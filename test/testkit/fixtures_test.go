package testkit

import (
	"errors"
	"path/filepath"
	"strings"
	"testing"

	"github.com/lifeline-edge/lifeline/cloud/api/v1alpha1"
)

func TestSubstitute(t *testing.T) {
	vars := map[string]string{"EDGE_NODE": "edge3", "EDGE_NODE_1": "edge1", "CLOUD_NODE": "cloud"}
	cases := []struct {
		name, in, want, wantErr string
	}{
		{"bare", "nodeName: $EDGE_NODE", "nodeName: edge3", ""},
		{"braced", "nodeName: ${CLOUD_NODE}", "nodeName: cloud", ""},
		{"a longer name is its own placeholder", "a: $EDGE_NODE_1, b: $EDGE_NODE", "a: edge1, b: edge3", ""},
		{"no placeholder", "url: /data/models/m.pb", "url: /data/models/m.pb", ""},
		{"lower case is not a placeholder", "value: $home", "value: $home", ""},
		{"unknown placeholders are named", "a: $API_KEY $EDGE_NODE $TOKEN", "", "[API_KEY TOKEN]"},
	}
	for _, tc := range cases {
		t.Run(tc.name, func(t *testing.T) {
			got, err := Substitute([]byte(tc.in), vars)
			switch {
			case tc.wantErr != "":
				if err == nil || !strings.Contains(err.Error(), tc.wantErr) {
					t.Fatalf("err = %v, want one naming %s", err, tc.wantErr)
				}
			case err != nil:
				t.Fatal(err)
			case string(got) != tc.want:
				t.Errorf("got %q, want %q", got, tc.want)
			}
		})
	}
}

// TestExamplesAreWhatTestsTakeThemFor: every file of deploy/examples decodes, placeholders substituted, into
// Lifeline's types and holds one service or job in the default namespace; the plainest two are what tests edit.
func TestExamplesAreWhatTestsTakeThemFor(t *testing.T) {
	set, err := Examples()
	if err != nil {
		t.Fatal(err)
	}
	files, err := set.Files()
	if err != nil {
		t.Fatal(err)
	}
	for _, file := range files {
		t.Run(file, func(t *testing.T) {
			objs, err := set.Objects(file, DefaultVars)
			if err != nil {
				t.Fatal(err)
			}
			workloads := 0
			for _, o := range objs {
				if o.GetNamespace() != "default" {
					t.Errorf("%s %s in namespace %q, want default", o.GetObjectKind().GroupVersionKind().Kind, o.GetName(), o.GetNamespace())
				}
				switch o.(type) {
				case *v1alpha1.JointInferenceService, *v1alpha1.FederatedLearningJob:
					workloads++
				}
			}
			if workloads != 1 {
				t.Errorf("%d services and jobs, want 1", workloads)
			}
		})
	}
	if err := set.LoadObject(set.Service, DefaultVars, &v1alpha1.JointInferenceService{}); err != nil {
		t.Errorf("the plainest service: %v", err)
	}
	job := &v1alpha1.FederatedLearningJob{}
	if err := set.LoadObject(set.Job, DefaultVars, job); err != nil {
		t.Errorf("the plainest job: %v", err)
	}
	if len(job.Spec.TrainingWorkers) < 2 || job.Spec.PretrainedModel != nil || job.Spec.Transmitter != nil {
		t.Errorf("the plainest job has %d trainers, pretrained model %v, transmitter %v: tests edit its second "+
			"trainer and add the others", len(job.Spec.TrainingWorkers), job.Spec.PretrainedModel, job.Spec.Transmitter)
	}
}

func TestSednaDirFromTheEnvironment(t *testing.T) {
	dir := t.TempDir()
	t.Setenv(DirEnv, dir)
	if got, err := SednaDir(); err != nil || got != dir {
		t.Errorf("SednaDir() = %q, %v; want %q", got, err, dir)
	}
	// Asked for and missing is an error, not an absence to skip over.
	t.Setenv(DirEnv, filepath.Join(dir, "missing"))
	if _, err := SednaDir(); err == nil || errors.Is(err, ErrNoSedna) {
		t.Errorf("SednaDir() of a missing %s = %v, want an error other than ErrNoSedna", DirEnv, err)
	}
}
