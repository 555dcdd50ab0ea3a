package outcome

import (
	"errors"
	"testing"

	apierrors "k8s.io/apimachinery/pkg/api/errors"
	"k8s.io/apimachinery/pkg/runtime/schema"
)

func TestOf(t *testing.T) {
	pods := schema.GroupResource{Resource: "pods"}
	notFound := apierrors.NewNotFound(pods, "p")
	conflict := apierrors.NewConflict(pods, "p", errors.New("uid precondition failed"))
	exists := apierrors.NewAlreadyExists(pods, "p")
	forbidden := apierrors.NewForbidden(pods, "p", errors.New("no"))
	tests := []struct {
		name     string
		err      error
		benign   []func(error) bool
		wantDone bool
		wantErr  error
	}{
		{name: "created", wantDone: true},
		{name: "deleted", benign: []func(error) bool{apierrors.IsNotFound, apierrors.IsConflict}, wantDone: true},
		{name: "already exists: no event, no error", err: exists, benign: []func(error) bool{apierrors.IsAlreadyExists}},
		{name: "already gone: no event, no error", err: notFound, benign: []func(error) bool{apierrors.IsNotFound, apierrors.IsConflict}},
		{name: "replaced meanwhile: no event, no error", err: conflict, benign: []func(error) bool{apierrors.IsNotFound, apierrors.IsConflict}},
		{name: "not benign: no event, the error", err: forbidden, benign: []func(error) bool{apierrors.IsNotFound}, wantErr: forbidden},
		{name: "nothing benign: the error", err: notFound, wantErr: notFound},
	}
	for _, tt := range tests {
		t.Run(tt.name, func(t *testing.T) {
			done, err := Of(tt.err, tt.benign...)
			if done != tt.wantDone || !errors.Is(err, tt.wantErr) || (err == nil) != (tt.wantErr == nil) {
				t.Errorf("Of(%v) = %v, %v; want %v, %v", tt.err, done, err, tt.wantDone, tt.wantErr)
			}
		})
	}
}
