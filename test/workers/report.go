package main

import (
	"bytes"
	"encoding/json"
	"fmt"
	"net/http"
	"time"

	lifelinev1 "github.com/lifeline-edge/lifeline/proto/lifeline/v1"
)

var httpClient = &http.Client{Timeout: 2 * time.Second}

// report sends a report to the node's LC endpoint; like Sedna's worker library it does not stop the worker when
// nobody listens.
func report(lcServer string, r lifelinev1.Report) error {
	if lcServer == "" {
		return nil
	}
	body, err := json.Marshal(r)
	if err != nil {
		return err
	}
	resp, err := httpClient.Post(fmt.Sprintf("%s/sedna/workers/%s/info", lcServer, r.Name), "application/json", bytes.NewReader(body))
	if err != nil {
		return err
	}
	resp.Body.Close()
	if resp.StatusCode != http.StatusOK {
		return fmt.Errorf("report: %s", resp.Status)
	}
	return nil
}
