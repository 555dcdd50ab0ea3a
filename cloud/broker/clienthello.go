package broker

import "encoding/binary"

// offeredTickets are the session tickets a TLS ClientHello offers to resume (its pre_shared_key extension's
// identities, the extension last as it must be), read from the start of what a client sent: one TLS record
// holding the whole ClientHello. Anything else, or anything cut short, offers none.
func offeredTickets(b []byte) [][]byte {
	const recordHandshake, handshakeClientHello, extensionPreSharedKey = 22, 1, 41
	record, ok := prefixed(b[min(len(b), 3):], 2) // type (1) and legacy version (2), then the record
	if !ok || b[0] != recordHandshake || len(record) < 4 || record[0] != handshakeClientHello {
		return nil
	}
	hello, ok := prefixed(record[1:], 3)
	if !ok || len(hello) < 34 {
		return nil
	}
	rest := hello[34:]                     // legacy version (2), random (32)
	for _, width := range []int{1, 2, 1} { // session id, cipher suites, compression methods
		var field []byte
		if field, ok = prefixed(rest, width); !ok {
			return nil
		}
		rest = rest[width+len(field):]
	}
	extensions, ok := prefixed(rest, 2)
	for ok && len(extensions) >= 4 {
		kind := binary.BigEndian.Uint16(extensions)
		var data []byte
		if data, ok = prefixed(extensions[2:], 2); !ok {
			return nil
		}
		extensions = extensions[4+len(data):]
		if kind == extensionPreSharedKey {
			if len(extensions) != 0 { // it must come last (RFC 8446, 4.2.11)
				return nil
			}
			return pskIdentities(data)
		}
	}
	return nil
}

// pskIdentities are the identities of a pre_shared_key extension's data: each a ticket and its age.
func pskIdentities(data []byte) [][]byte {
	list, ok := prefixed(data, 2)
	var out [][]byte
	for ok && len(list) > 0 {
		var identity []byte
		if identity, ok = prefixed(list, 2); !ok || len(list) < 2+len(identity)+4 {
			return out
		}
		out = append(out, identity)
		list = list[2+len(identity)+4:] // the identity, then its obfuscated ticket age (4)
	}
	return out
}

// prefixed is the field at the start of b whose length is its first width bytes (big-endian); false when b is
// shorter than that.
func prefixed(b []byte, width int) ([]byte, bool) {
	if len(b) < width {
		return nil, false
	}
	n := 0
	for _, c := range b[:width] {
		n = n<<8 | int(c)
	}
	if len(b) < width+n {
		return nil, false
	}
	return b[width : width+n], true
}
