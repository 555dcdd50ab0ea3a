package main

import (
	"bytes"
	"encoding/json"
	"fmt"
	"log"
	"net/http"
	"time"

	lifelinev1 "github.com/lifeline-edge/lifeline/proto/lifeline/v1"
)

var httpClient = &http.Client{Timeout: 2 * time.Second}

// reportRetry is how often, and how far apart, a report is tried.
type reportRetry struct {
	attempts int
	spacing  time.Duration
}

// sednaRetry is the retry of Sedna's worker library: five attempts, three seconds apart.
var sednaRetry = reportRetry{attempts: 5, spacing: 3 * time.Second}

// report sends a report to the node's LC endpoint, trying again as Sedna's worker library does while the
// endpoint does not answer (an agent restarting, being upgraded); like that library it does not stop the worker
// when nobody listens. It logs a report delivered after a retry, and one given up: a lost report.
func report(lcServer string, r lifelinev1.Report) error {
	return reportWithRetry(sednaRetry, lcServer, r)
}

func reportWithRetry(retry reportRetry, lcServer string, r lifelinev1.Report) error {
	if lcServer == "" {
		return nil
	}
	body, err := json.Marshal(r)
	if err != nil {
		return err
	}
	for attempt := 1; ; attempt++ {
		err = postReport(fmt.Sprintf("%s/sedna/workers/%s/info", lcServer, r.Name), body)
		switch {
		case err == nil && attempt > 1:
			log.Printf("report delivered at attempt %d", attempt)
			return nil
		case err == nil:
			return nil
		case attempt == retry.attempts:
			log.Printf("report lost after %d attempts: %v", attempt, err)
			return err
		}
		time.Sleep(retry.spacing)
	}
}

func postReport(url string, body []byte) error {
	resp, err := httpClient.Post(url, "application/json", bytes.NewReader(body))
	if err != nil {
		return err
	}
	resp.Body.Close()
	if resp.StatusCode != http.StatusOK {
		return fmt.Errorf("report: %s", resp.Status)
	}
	return nil
}
