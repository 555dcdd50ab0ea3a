package standin

import (
	"context"
	"time"
)

// imageCommands caches what images run, as the node's runtime tells it: Arm looks at every armable worker's
// containers each tick, and a runtime call each would be one per container a second. An entry is asked again
// after imageCommandTTL, so a tag pulled anew is read anew; entries older are forgotten, which bounds the cache to
// the images of the workers armed within that time.
type imageCommands map[string]imageCommandAt

type imageCommandAt struct {
	ImageCommand
	at time.Time
}

// imageCommandTTL is how long what an image runs is taken as known.
const imageCommandTTL = time.Minute

// of is what image runs, from the cache or runtime.
func (c *imageCommands) of(ctx context.Context, runtime Runtime, image string, now time.Time) (ImageCommand, error) {
	if e, ok := (*c)[image]; ok && now.Sub(e.at) < imageCommandTTL {
		return e.ImageCommand, nil
	}
	entrypoint, cmd, err := runtime.ImageCommand(ctx, image)
	if err != nil {
		return ImageCommand{}, err
	}
	if *c == nil {
		*c = imageCommands{}
	}
	ic := ImageCommand{Entrypoint: entrypoint, Cmd: cmd}
	(*c)[image] = imageCommandAt{ImageCommand: ic, at: now}
	return ic, nil
}

// forget drops the entries asked longer than imageCommandTTL ago.
func (c imageCommands) forget(now time.Time) {
	for image, e := range c {
		if now.Sub(e.at) >= imageCommandTTL {
			delete(c, image)
		}
	}
}
