// Package outcome sorts the result of a write to the API server into what the controllers report: an Event says
// that something happened, so it is emitted only when the write itself did it, not when the object was already
// there (AlreadyExists) or already gone or replaced (NotFound, a failed precondition).
package outcome

// Of tells whether a create or delete that returned err took effect, and the error to return: nil when err is
// nil or one of the benign errors (the world is already as wanted, by someone else's doing), err otherwise.
func Of(err error, benign ...func(error) bool) (done bool, _ error) {
	if err == nil {
		return true, nil
	}
	for _, b := range benign {
		if b(err) {
			return false, nil
		}
	}
	return false, err
}
