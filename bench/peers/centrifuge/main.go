// Centrifuge (github.com/centrifugal/centrifuge, the Go library Centrifugo is built on) as a
// benchmark peer, speaking what `clarion bench` speaks: WebSocket clients on /ws?topic=T that
// send Centrifuge's connect command ({"id":1,"connect":{}}) and are subscribed to T by the
// server (a server-side subscription, no subscribe command), and Clarion's publish batch
// (POST /publish, {"messages":[{"topic":..,"data":..}]}) on a second port, each message's data
// published to its topic as a JSON string, in order.
//
//	go run . PORT API_PORT [THREADS]
//
// THREADS sets GOMAXPROCS (default: Go's, one per core). Everything else is Centrifuge's
// default: memory broker without history, its own ping/pong (the bench answers pings).
package main

import (
	"context"
	"encoding/json"
	"fmt"
	"io"
	"log"
	"net/http"
	"os"
	"runtime"
	"strconv"

	"github.com/centrifugal/centrifuge"
)

type topicKey struct{}

type batch struct {
	Messages []struct {
		Topic string `json:"topic"`
		Data  string `json:"data"`
	} `json:"messages"`
}

func main() {
	if len(os.Args) < 3 {
		fmt.Fprintln(os.Stderr, "usage: centrifuge-peer PORT API_PORT [THREADS]")
		os.Exit(2)
	}
	port, apiPort := os.Args[1], os.Args[2]
	if len(os.Args) > 3 {
		n, err := strconv.Atoi(os.Args[3])
		if err != nil || n < 1 {
			log.Fatalf("bad THREADS %q", os.Args[3])
		}
		runtime.GOMAXPROCS(n)
	}
	node, err := centrifuge.New(centrifuge.Config{LogLevel: centrifuge.LogLevelError})
	if err != nil {
		log.Fatal(err)
	}
	// Every connection is anonymous and subscribed server-side to the topic in its URL.
	node.OnConnecting(func(ctx context.Context, e centrifuge.ConnectEvent) (centrifuge.ConnectReply, error) {
		topic, _ := ctx.Value(topicKey{}).(string)
		if topic == "" {
			return centrifuge.ConnectReply{}, centrifuge.DisconnectBadRequest
		}
		return centrifuge.ConnectReply{
			Credentials:   &centrifuge.Credentials{UserID: ""},
			Subscriptions: map[string]centrifuge.SubscribeOptions{topic: {}},
		}, nil
	})
	node.OnConnect(func(*centrifuge.Client) {})
	if err := node.Run(); err != nil {
		log.Fatal(err)
	}
	ws := centrifuge.NewWebsocketHandler(node, centrifuge.WebsocketConfig{})
	clients := http.NewServeMux()
	clients.HandleFunc("/ws", func(w http.ResponseWriter, r *http.Request) {
		ctx := context.WithValue(r.Context(), topicKey{}, r.URL.Query().Get("topic"))
		ws.ServeHTTP(w, r.WithContext(ctx))
	})
	api := http.NewServeMux()
	api.HandleFunc("/publish", func(w http.ResponseWriter, r *http.Request) {
		body, err := io.ReadAll(io.LimitReader(r.Body, 16<<20))
		var b batch
		if err == nil {
			err = json.Unmarshal(body, &b)
		}
		if err != nil {
			http.Error(w, err.Error(), http.StatusBadRequest)
			return
		}
		for _, m := range b.Messages {
			data, _ := json.Marshal(m.Data)
			if _, err := node.Publish(m.Topic, data); err != nil {
				http.Error(w, err.Error(), http.StatusInternalServerError)
				return
			}
		}
		_, _ = io.WriteString(w, "ok")
	})
	go func() { log.Fatal(http.ListenAndServe("127.0.0.1:"+apiPort, api)) }()
	fmt.Printf("ready %s\n", port)
	log.Fatal(http.ListenAndServe("127.0.0.1:"+port, clients))
}
