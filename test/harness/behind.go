package harness

import (
	"context"
	"reflect"

	"sigs.k8s.io/controller-runtime/pkg/client"
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
