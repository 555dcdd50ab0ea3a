package main

import (
	"bytes"
	"encoding/json"
	"fmt"
	"log"
	"net"
	"net/http"
	"os"
	"strconv"
	"sync"
	"time"

	lifelinev1 "github.com/lifeline-edge/lifeline/proto/lifeline/v1"
)

// roundState is the aggregator's view: the current round and who has sent an update for it.
type roundState struct {
	Round   int      `json:"round"`
	Rounds  int      `json:"rounds"`
	Done    bool     `json:"done"`
	Clients []string `json:"clients"`
	// TotalSample is the samples of the clients of the last aggregated round, what Sedna's aggregator sends
	// back as total_sample.
	TotalSample int `json:"totalSample"`
}

// runAggregator waits for PARTICIPANTS_COUNT distinct clients (by WORKER_NAME) to send an update for a round,
// then starts the next; after exit_round rounds it answers "done" for a while and exits 0.
func runAggregator(env contractEnv) error {
	port, err := env.require("AGG_BIND_PORT")
	if err != nil {
		return err
	}
	participants, err := strconv.Atoi(env.or("PARTICIPANTS_COUNT", "1"))
	if err != nil {
		return fmt.Errorf("PARTICIPANTS_COUNT: %w", err)
	}
	rounds, err := strconv.Atoi(env.or("exit_round", "3"))
	if err != nil {
		return fmt.Errorf("exit_round: %w", err)
	}
	var mu sync.Mutex
	state := roundState{Round: 1, Rounds: rounds}
	samples := 0 // of the current round's clients
	seen := map[string]bool{}
	finished := make(chan struct{})
	mux := http.NewServeMux()
	mux.HandleFunc("GET /round", func(w http.ResponseWriter, r *http.Request) {
		mu.Lock()
		defer mu.Unlock()
		_ = json.NewEncoder(w).Encode(state)
	})
	mux.HandleFunc("POST /update", func(w http.ResponseWriter, r *http.Request) {
		var u struct {
			Worker  string `json:"worker"`
			Round   int    `json:"round"`
			Samples int    `json:"samples"`
		}
		if err := json.NewDecoder(r.Body).Decode(&u); err != nil || u.Worker == "" {
			http.Error(w, "bad update", http.StatusBadRequest)
			return
		}
		mu.Lock()
		defer mu.Unlock()
		if u.Round == state.Round && !state.Done && !seen[u.Worker] {
			seen[u.Worker] = true
			state.Clients = append(state.Clients, u.Worker)
			samples += u.Samples
			if len(seen) >= participants {
				log.Printf("round %d aggregated from %v", state.Round, state.Clients)
				state.TotalSample, samples = samples, 0
				if state.Round >= rounds {
					state.Done = true
					close(finished)
				} else {
					state.Round++
					seen, state.Clients = map[string]bool{}, nil
				}
			}
		}
		_ = json.NewEncoder(w).Encode(state)
	})
	srv := &http.Server{Addr: net.JoinHostPort("", port), Handler: mux}
	go func() {
		<-finished
		time.Sleep(3 * time.Second) // let the trainers read "done"
		_ = srv.Close()
	}()
	log.Printf("aggregator %s waiting for %d clients, %d rounds", env.get("WORKER_NAME"), participants, rounds)
	if err := srv.ListenAndServe(); err != http.ErrServerClosed {
		return err
	}
	log.Printf("training finished after %d rounds", rounds)
	return nil
}

// runTrainer sends one update per round, retrying until the aggregator answers, reports each aggregated round
// to LC_SERVER as Sedna's FederatedLearning.train does, and exits 0 when the aggregator says the training is
// done.
func runTrainer(env contractEnv) error {
	host, err := env.require("AGG_IP")
	if err != nil {
		return err
	}
	port, err := env.require("AGG_PORT")
	if err != nil {
		return err
	}
	name, err := env.require("WORKER_NAME")
	if err != nil {
		return err
	}
	samples := countLines(env.get("TRAIN_DATASET_URL"))
	base := "http://" + net.JoinHostPort(host, port)
	sent, reported := 0, 0
	start := time.Now()
	for {
		var state roundState
		resp, err := httpClient.Get(base + "/round")
		if err == nil {
			err = json.NewDecoder(resp.Body).Decode(&state)
			resp.Body.Close()
		}
		if err != nil {
			time.Sleep(300 * time.Millisecond) // the aggregator is not up yet, or gone
			continue
		}
		// A round is reported once the aggregator has moved past it (or is done), as Sedna's trainer reports
		// after it received the round's aggregated weights.
		done := state.Round - 1
		if state.Done {
			done = state.Round
		}
		if done > reported && sent >= done {
			reported = done
			status := "running"
			if state.Done {
				status = "completed"
			}
			_ = report(env.get("LC_SERVER"), trainReport(env, name, done, state.TotalSample, start, status))
			start = time.Now()
		}
		if state.Done {
			log.Printf("training done after round %d", state.Round)
			return nil
		}
		body, _ := json.Marshal(map[string]any{"worker": name, "round": state.Round, "samples": samples})
		if resp, err := httpClient.Post(base+"/update", "application/json", bytes.NewReader(body)); err == nil {
			resp.Body.Close()
			sent = state.Round
		}
		time.Sleep(300 * time.Millisecond)
	}
}

// trainReport is what Sedna's trainer reports after a round: its round in ownerInfo, the model it saved in
// results (the estimator's model_info), no round there.
func trainReport(env contractEnv, name string, round, sampleCount int, start time.Time, status string) lifelinev1.Report {
	model := env.or("MODEL_URL", "/home/data/model")
	return lifelinev1.Report{
		Name: name, Namespace: env.get("NAMESPACE"), OwnerName: env.ownerName(),
		OwnerKind: "default", Kind: "train", Status: status,
		OwnerInfo: map[string]any{
			"currentRound": round, "sampleCount": sampleCount,
			"startTime": start.Format(lifelinev1.TimeLayout), "updateTime": time.Now().Format(lifelinev1.TimeLayout),
		},
		Results: []lifelinev1.ReportResult{{Format: "pb", URL: model,
			Metrics: map[string]any{"loss": 1.0 / float64(round+1), "accuracy": []float64{1 - 1.0/float64(round+1)}}}},
	}
}

// countLines counts the lines of a data set index file, 0 when it cannot be read.
func countLines(path string) int {
	data, err := os.ReadFile(path)
	if err != nil || len(data) == 0 {
		return 0
	}
	n := bytes.Count(data, []byte("\n"))
	if data[len(data)-1] != '\n' {
		n++
	}
	return n
}
