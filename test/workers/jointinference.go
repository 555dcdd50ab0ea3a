package main

import (
	"bytes"
	"encoding/json"
	"fmt"
	"log"
	"net"
	"net/http"
	"strconv"
	"sync/atomic"
	"time"

	lifelinev1 "github.com/lifeline-edge/lifeline/proto/lifeline/v1"
)

// runBigModel serves /sedna/predict on BIG_MODEL_BIND_PORT and counts what it answered on /stats.
func runBigModel(env contractEnv) error {
	port, err := env.require("BIG_MODEL_BIND_PORT")
	if err != nil {
		return err
	}
	var served atomic.Int64
	mux := http.NewServeMux()
	mux.HandleFunc("POST /sedna/predict", func(w http.ResponseWriter, r *http.Request) {
		var example map[string]any
		if err := json.NewDecoder(r.Body).Decode(&example); err != nil {
			http.Error(w, err.Error(), http.StatusBadRequest)
			return
		}
		n := served.Add(1)
		_ = json.NewEncoder(w).Encode(map[string]any{"label": "helmet", "confidence": 0.97, "served": n})
	})
	mux.HandleFunc("GET /stats", func(w http.ResponseWriter, r *http.Request) {
		_ = json.NewEncoder(w).Encode(map[string]any{"served": served.Load(), "worker": env.get("WORKER_NAME")})
	})
	log.Printf("big model %s serving on :%s", env.get("WORKER_NAME"), port)
	return http.ListenAndServe(net.JoinHostPort("", port), mux)
}

// runLittleModel infers locally every 200 ms, sends every third example (the "hard" ones) to the big model, and
// reports its counters to LC_SERVER every LC_PERIOD seconds (3 by default here; Sedna's library: 30). It keeps inferring when the cloud cannot be reached.
func runLittleModel(env contractEnv) error {
	host, err := env.require("BIG_MODEL_IP")
	if err != nil {
		return err
	}
	port, err := env.require("BIG_MODEL_PORT")
	if err != nil {
		return err
	}
	name := env.workerName()
	url := fmt.Sprintf("http://%s/sedna/predict", net.JoinHostPort(host, port))
	var inferred, hard, uploaded int
	lastReport := time.Now()
	period := time.Duration(periodSeconds(env)) * time.Second
	for {
		time.Sleep(200 * time.Millisecond)
		inferred++
		if inferred%3 == 0 {
			hard++
			body, _ := json.Marshal(map[string]any{"example": inferred, "worker": name})
			if resp, err := httpClient.Post(url, "application/json", bytes.NewReader(body)); err == nil {
				resp.Body.Close()
				if resp.StatusCode == http.StatusOK {
					uploaded++
				}
			}
		}
		if time.Since(lastReport) >= period {
			start := lastReport
			lastReport = time.Now()
			// As Sedna's LCReporter sends it: no status, an empty results list, the counters in ownerInfo; a hard
			// example counts once the cloud answered it.
			err := report(env.get("LC_SERVER"), lifelinev1.Report{
				Name: name, Namespace: env.get("NAMESPACE"), OwnerName: env.ownerName(),
				OwnerKind: "jointinferenceservice", Kind: "inference", Results: []lifelinev1.ReportResult{},
				OwnerInfo: map[string]any{
					"startTime": start.Format(lifelinev1.TimeLayout), "updateTime": lastReport.Format(lifelinev1.TimeLayout),
					"inferenceNumber": inferred, "hardExampleNumber": uploaded, "uploadCloudRatio": ratio(uploaded, inferred),
				},
			})
			if err != nil {
				log.Printf("report: %v", err)
			}
			log.Printf("inferred %d, hard %d, answered by the cloud %d", inferred, hard, uploaded)
		}
	}
}

// periodSeconds is LC_PERIOD, the report period Sedna's library reads, 3 when unset or invalid.
func periodSeconds(env contractEnv) int {
	if n, err := strconv.Atoi(env.get("LC_PERIOD")); err == nil && n > 0 {
		return n
	}
	return 3
}

func ratio(a, b int) float64 {
	if b == 0 {
		return 0
	}
	return float64(a) / float64(b)
}
