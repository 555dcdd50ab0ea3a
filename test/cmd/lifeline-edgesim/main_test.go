package main

import "testing"

// edgecore's MetaServer listens on 127.0.0.1:10550 unless told otherwise, so an agent configured with its
// defaults finds the hollow node's; several hollow nodes on one host each pass their own address, and an empty
// one serves none.
func TestMetaServerAddressDefaultsToEdgecores(t *testing.T) {
	cases := []struct {
		args []string
		want string
	}{
		{nil, "127.0.0.1:10550"},
		{[]string{"--metaserver-address=127.0.0.1:20550"}, "127.0.0.1:20550"},
		{[]string{"--metaserver-address="}, ""},
	}
	for _, tc := range cases {
		o, err := parseFlags(tc.args)
		if err != nil {
			t.Fatal(err)
		}
		if o.metaServer != tc.want {
			t.Errorf("%v: MetaServer on %q, want %q", tc.args, o.metaServer, tc.want)
		}
	}
}
