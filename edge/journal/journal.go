// Package journal keeps on disk what an edge agent has not yet got acknowledged by the broker: the latest state
// of each worker, and a bounded log of reports. Entries come back in the order they were put, and leave only
// when acknowledged, so a broker outage or an agent restart loses nothing but what the bound drops — and that
// is counted. [P-JRN-1]
package journal

import (
	"encoding/binary"
	"encoding/json"
	"fmt"
	"sort"
	"sync"
	"sync/atomic"
	"time"

	bolt "go.etcd.io/bbolt"
)

// Entry is one message waiting for the broker.
type Entry struct {
	// Seq orders entries; the journal assigns it.
	Seq      uint64 `json:"seq"`
	Topic    string `json:"topic"`
	Payload  []byte `json:"payload"`
	QoS      byte   `json:"qos"`
	Retained bool   `json:"retained"`
	// Key, when set, makes the entry replace any pending entry with the same key: only the latest state of a
	// worker matters. Entries without a key form the bounded log.
	Key string `json:"key,omitempty"`
}

var (
	entriesBucket = []byte("entries")  // seq -> entry
	keysBucket    = []byte("keys")     // key -> seq of its pending entry
	metaBucket    = []byte("meta")     // counters that survive restarts
	commandBucket = []byte("commands") // executed command id -> when it may be forgotten (unix nano)
	valuesBucket  = []byte("values")   // small values kept across restarts, by key
	nextSeqKey    = []byte("next-seq")
	droppedKey    = []byte("dropped")
)

// DefaultMaxLogBytes bounds the log's entries in bytes when Open is given only a count: 8 MiB keeps an agent
// replaying a full log far under its memory limit, and holds thousands of Sedna's reports (a few hundred bytes
// each).
const DefaultMaxLogBytes = 8 << 20

// Limits bound the log of keyless entries; the oldest go first when either is reached.
type Limits struct {
	// Entries is how many keyless entries are kept.
	Entries int
	// Bytes is how many bytes keyless entries take, as stored; an entry larger than it alone is refused.
	Bytes int64
}

// Journal is a bbolt file. It is safe for concurrent use.
type Journal struct {
	db     *bolt.DB
	limits Limits
	// write serialises the transactions that change the log, so the counters below, which are adjusted only
	// once a transaction committed, always describe the file: a write that fails (a full disk) changes nothing.
	write    sync.Mutex
	logSize  atomic.Int64
	logBytes atomic.Int64
	dropped  atomic.Uint64
}

// Open opens (or creates) the journal at path; at most maxLog keyless entries are kept, in at most
// DefaultMaxLogBytes.
func Open(path string, maxLog int) (*Journal, error) {
	return OpenLimited(path, Limits{Entries: maxLog, Bytes: DefaultMaxLogBytes})
}

// OpenLimited opens (or creates) the journal at path with its log bounded by limits.
func OpenLimited(path string, limits Limits) (*Journal, error) {
	return open(path, limits, &bolt.Options{Timeout: 2 * time.Second})
}

func open(path string, limits Limits, opts *bolt.Options) (*Journal, error) {
	db, err := bolt.Open(path, 0o600, opts)
	if err != nil {
		return nil, fmt.Errorf("opening journal %s: %w", path, err)
	}
	j := &Journal{db: db, limits: limits}
	err = db.Update(func(tx *bolt.Tx) error {
		for _, b := range [][]byte{entriesBucket, keysBucket, metaBucket, commandBucket, valuesBucket} {
			if _, err := tx.CreateBucketIfNotExists(b); err != nil {
				return err
			}
		}
		j.dropped.Store(readUint(tx.Bucket(metaBucket), droppedKey))
		var n, size int64
		err := tx.Bucket(entriesBucket).ForEach(func(_, v []byte) error {
			if keyless(v) {
				n++
				size += int64(len(v))
			}
			return nil
		})
		j.logSize.Store(n)
		j.logBytes.Store(size)
		return err
	})
	if err != nil {
		db.Close()
		return nil, fmt.Errorf("initialising journal %s: %w", path, err)
	}
	return j, nil
}

// Close closes the file.
func (j *Journal) Close() error { return j.db.Close() }

// Put stores e with the next sequence number and returns it. A keyless entry makes room for itself by dropping
// the oldest ones, counted, when the log is full by count or by bytes.
func (j *Journal) Put(e Entry) (uint64, error) {
	j.write.Lock()
	defer j.write.Unlock()
	// What the transaction did to the log, applied to the counters once it committed.
	var grew, shrank, dropped, freed, stored int64
	err := j.db.Update(func(tx *bolt.Tx) error {
		grew, shrank, dropped, freed, stored = 0, 0, 0, 0, 0
		entries, keys, meta := tx.Bucket(entriesBucket), tx.Bucket(keysBucket), tx.Bucket(metaBucket)
		e.Seq = readUint(meta, nextSeqKey) + 1
		if err := writeUint(meta, nextSeqKey, e.Seq); err != nil {
			return err
		}
		data, err := json.Marshal(e)
		if err != nil {
			return err
		}
		if e.Key != "" {
			if old := keys.Get([]byte(e.Key)); old != nil {
				if err := entries.Delete(old); err != nil {
					return err
				}
			}
			if err := keys.Put([]byte(e.Key), seqKey(e.Seq)); err != nil {
				return err
			}
			return entries.Put(seqKey(e.Seq), data)
		}
		if j.limits.Bytes > 0 && int64(len(data)) > j.limits.Bytes {
			return fmt.Errorf("entry of %d bytes over the log's bound of %d", len(data), j.limits.Bytes)
		}
		c := entries.Cursor()
		for k, v := c.First(); k != nil && j.full(grew-shrank, freed, int64(len(data))); k, v = c.Next() {
			if !keyless(v) {
				continue
			}
			freed += int64(len(v))
			shrank++
			dropped++
			if err := c.Delete(); err != nil {
				return err
			}
		}
		if dropped > 0 {
			if err := writeUint(meta, droppedKey, j.dropped.Load()+uint64(dropped)); err != nil {
				return err
			}
		}
		grew, stored = 1, int64(len(data))
		return entries.Put(seqKey(e.Seq), data)
	})
	if err != nil {
		return 0, fmt.Errorf("journaling %s: %w", e.Topic, err)
	}
	j.logSize.Add(grew - shrank)
	j.logBytes.Add(stored - freed)
	j.dropped.Add(uint64(dropped))
	return e.Seq, nil
}

// full tells whether the log, changed by delta entries and freed bytes so far in a transaction, has no room
// for one more entry of size bytes.
func (j *Journal) full(delta, freed, size int64) bool {
	return (j.limits.Entries > 0 && j.logSize.Load()+delta >= int64(j.limits.Entries)) ||
		(j.limits.Bytes > 0 && j.logBytes.Load()-freed+size > j.limits.Bytes)
}

// keyless tells whether a stored entry belongs to the log: only keyed entries carry "key" (omitempty).
func keyless(stored []byte) bool {
	var e struct {
		Key string `json:"key"`
	}
	return json.Unmarshal(stored, &e) == nil && e.Key == ""
}

// PendingKeyed returns the keyed entries not yet acknowledged (the workers' latest states: one per key, so as
// many as the node has workers), in the order they were put.
func (j *Journal) PendingKeyed() ([]Entry, error) {
	var out []Entry
	err := j.db.View(func(tx *bolt.Tx) error {
		entries := tx.Bucket(entriesBucket)
		return tx.Bucket(keysBucket).ForEach(func(_, seq []byte) error {
			v := entries.Get(seq)
			if v == nil {
				return nil
			}
			var e Entry
			if err := json.Unmarshal(v, &e); err != nil {
				return err
			}
			out = append(out, e)
			return nil
		})
	})
	sort.Slice(out, func(a, b int) bool { return out[a].Seq < out[b].Seq })
	return out, err
}

// PendingLog returns at most limit keyless entries not yet acknowledged whose sequence is above after, in the
// order they were put: the log is replayed a page at a time, never held whole in memory.
func (j *Journal) PendingLog(after uint64, limit int) ([]Entry, error) {
	var out []Entry
	err := j.db.View(func(tx *bolt.Tx) error {
		c := tx.Bucket(entriesBucket).Cursor()
		for k, v := c.Seek(seqKey(after + 1)); k != nil && len(out) < limit; k, v = c.Next() {
			var e Entry
			if err := json.Unmarshal(v, &e); err != nil {
				return err
			}
			if e.Key == "" {
				out = append(out, e)
			}
		}
		return nil
	})
	return out, err
}

// LogEntries is how many entries the log holds.
func (j *Journal) LogEntries() int64 { return j.logSize.Load() }

// LogBytes is how many bytes the log's entries take, as stored.
func (j *Journal) LogBytes() int64 { return j.logBytes.Load() }

// Pending returns every entry not yet acknowledged, in the order they were put: for inspection; the
// publisher replays with PendingKeyed and PendingLog.
func (j *Journal) Pending() ([]Entry, error) {
	var out []Entry
	err := j.db.View(func(tx *bolt.Tx) error {
		return tx.Bucket(entriesBucket).ForEach(func(_, v []byte) error {
			var e Entry
			if err := json.Unmarshal(v, &e); err != nil {
				return err
			}
			out = append(out, e)
			return nil
		})
	})
	return out, err
}

// Ack removes an entry the broker acknowledged. A key's entry is removed only if it is still the latest one.
func (j *Journal) Ack(seq uint64) error {
	j.write.Lock()
	defer j.write.Unlock()
	var shrank int64 // bytes the log gave back
	err := j.db.Update(func(tx *bolt.Tx) error {
		shrank = 0
		entries, keys := tx.Bucket(entriesBucket), tx.Bucket(keysBucket)
		v := entries.Get(seqKey(seq))
		if v == nil {
			return nil
		}
		var e Entry
		if err := json.Unmarshal(v, &e); err != nil {
			return err
		}
		if e.Key != "" {
			if cur := keys.Get([]byte(e.Key)); cur != nil && binary.BigEndian.Uint64(cur) == seq {
				if err := keys.Delete([]byte(e.Key)); err != nil {
					return err
				}
			}
		} else {
			shrank = int64(len(v))
		}
		return entries.Delete(seqKey(seq))
	})
	if err != nil {
		return fmt.Errorf("removing acknowledged entry %d: %w", seq, err)
	}
	if shrank > 0 {
		j.logSize.Add(-1)
		j.logBytes.Add(-shrank)
	}
	return nil
}

// NextCounter increments and returns a named counter kept in the journal's file, for sequence numbers that
// must grow across restarts (worker state seq [P-WS-2]).
func (j *Journal) NextCounter(name string) (uint64, error) {
	var v uint64
	err := j.db.Update(func(tx *bolt.Tx) error {
		meta := tx.Bucket(metaBucket)
		key := []byte("counter/" + name)
		v = readUint(meta, key) + 1
		return writeUint(meta, key, v)
	})
	return v, err
}

// AdvanceCounter raises a named counter to at least to, so a sequence number handed out from memory is never
// handed out again after a restart.
func (j *Journal) AdvanceCounter(name string, to uint64) error {
	return j.db.Update(func(tx *bolt.Tx) error {
		meta := tx.Bucket(metaBucket)
		key := []byte("counter/" + name)
		if readUint(meta, key) >= to {
			return nil
		}
		return writeUint(meta, key, to)
	})
}

// ClaimCommand records that the command id is being executed and tells whether it was new. A command is
// executed at most once, across agent restarts too [P-CMD-3]; ids are forgotten after forgetAfter (their
// expiry: an expired command is refused anyway), so the file does not grow without bound, and an id past its
// forgetAfter is claimable again.
func (j *Journal) ClaimCommand(id string, forgetAfter time.Time, now time.Time) (bool, error) {
	claimed := false
	err := j.db.Update(func(tx *bolt.Tx) error {
		b := tx.Bucket(commandBucket)
		var stale [][]byte
		_ = b.ForEach(func(k, v []byte) error {
			if len(v) == 8 && int64(binary.BigEndian.Uint64(v)) < now.UnixNano() {
				stale = append(stale, k)
			}
			return nil
		})
		for _, k := range stale {
			if err := b.Delete(k); err != nil {
				return err
			}
		}
		if b.Get([]byte(id)) != nil {
			return nil
		}
		claimed = true
		return writeUint(b, []byte(id), uint64(forgetAfter.UnixNano()))
	})
	return claimed, err
}

// Value returns the value kept under key, nil when there is none. Values are small records that must survive
// agent restarts (the workers' episodes); their owner bounds how many it keeps.
func (j *Journal) Value(key string) ([]byte, error) {
	var v []byte
	err := j.db.View(func(tx *bolt.Tx) error {
		v = append([]byte(nil), tx.Bucket(valuesBucket).Get([]byte(key))...)
		return nil
	})
	if err != nil || len(v) == 0 {
		return nil, err
	}
	return v, nil
}

// SetValue keeps v under key; nil removes it.
func (j *Journal) SetValue(key string, v []byte) error {
	return j.db.Update(func(tx *bolt.Tx) error {
		if v == nil {
			return tx.Bucket(valuesBucket).Delete([]byte(key))
		}
		return tx.Bucket(valuesBucket).Put([]byte(key), v)
	})
}

// Dropped counts log entries dropped because the log was full, over the journal's whole life.
func (j *Journal) Dropped() uint64 { return j.dropped.Load() }

// seqKey encodes seq big-endian, so bbolt's byte order is sequence order.
func seqKey(seq uint64) []byte {
	k := make([]byte, 8)
	binary.BigEndian.PutUint64(k, seq)
	return k
}

func readUint(b *bolt.Bucket, key []byte) uint64 {
	if v := b.Get(key); len(v) == 8 {
		return binary.BigEndian.Uint64(v)
	}
	return 0
}

func writeUint(b *bolt.Bucket, key []byte, v uint64) error { return b.Put(key, seqKey(v)) }
