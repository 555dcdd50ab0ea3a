package harness

import (
	"context"
	"reflect"
	"testing"

	ctrl "sigs.k8s.io/controller-runtime"
	"sigs.k8s.io/controller-runtime/pkg/client"

	"github.com/lifeline-edge/lifeline/cloud/workload"
)

// Behind is a client whose reads of one object return the copy it was given, as a cache that has not yet seen
// the object's latest version does; everything else goes to Client.
type Behind struct {
	client.Client
	// Copy is what a read of its namespace and name returns, as an object of its type.
	Copy client.Object
}

// Get returns Behind.Copy for its key and type, and asks the client otherwise.
func (b Behind) Get(ctx context.Context, key client.ObjectKey, obj client.Object, opts ...client.GetOption) error {
	if key == client.ObjectKeyFromObject(b.Copy) && reflect.TypeOf(obj) == reflect.TypeOf(b.Copy) {
		reflect.ValueOf(obj).Elem().Set(reflect.ValueOf(b.Copy.DeepCopyObject()).Elem())
		return nil
	}
	return b.Client.Get(ctx, key, obj, opts...)
}

// StatusWriter is the status writer the controller runs with (workload.RESTStatusWriter), on mgr's connection:
// a pass a test builds by hand writes its status as the running controller's do.
func StatusWriter(t testing.TB, mgr ctrl.Manager) workload.StatusWriter {
	t.Helper()
	w, err := workload.NewRESTStatusWriter(mgr.GetConfig(), mgr.GetHTTPClient(), mgr.GetScheme(), mgr.GetRESTMapper())
	if err != nil {
		t.Fatal(err)
	}
	return w
}
