package main

import (
	"strings"
	"testing"
)

const good = `apiVersion: v1
kind: Service
metadata: {name: s}
spec:
  ports: [{name: api, port: 8081, targetPort: api}]
`

func TestAValidObjectDecodes(t *testing.T) {
	if n, errs := checkDocs([]byte(good)); n != 1 || len(errs) != 0 {
		t.Fatalf("n=%d errs=%v", n, errs)
	}
}

func TestAnUnknownFieldFails(t *testing.T) {
	doc := strings.Replace(good, "spec:", "spec:\n  portz: []", 1)
	if _, errs := checkDocs([]byte(doc)); len(errs) != 1 || !strings.Contains(errs[0].Error(), "portz") {
		t.Fatalf("errs=%v", errs)
	}
}

func TestAWrongTypeFails(t *testing.T) {
	doc := strings.Replace(good, "port: 8081", `port: "eighty"`, 1)
	if _, errs := checkDocs([]byte(doc)); len(errs) != 1 {
		t.Fatalf("errs=%v", errs)
	}
}

func TestAMisplacedPreStopSleepFails(t *testing.T) {
	doc := `apiVersion: apps/v1
kind: Deployment
metadata: {name: d}
spec:
  selector: {matchLabels: {a: b}}
  template:
    metadata: {labels: {a: b}}
    spec:
      containers:
        - name: c
          lifecycle: {preStop: {sleeep: {seconds: 5}}}
`
	if _, errs := checkDocs([]byte(doc)); len(errs) != 1 {
		t.Fatalf("errs=%v", errs)
	}
}

func TestAnUnexpectedKindFails(t *testing.T) {
	doc := "apiVersion: v1\nkind: Pod\nmetadata: {name: p}\n"
	if _, errs := checkDocs([]byte(doc)); len(errs) != 1 {
		t.Fatalf("errs=%v", errs)
	}
}
