package main

import (
	"bytes"
	"encoding/json"
	"fmt"
	"text/tabwriter"

	"go.yaml.in/yaml/v3"
)

// render writes v as JSON or YAML with -o json|yaml, else as a table of the
// given header and rows (wide shows the same columns the command chooses
// for it). The views' 64-bit integers carry `json:",string"`: JSON and YAML
// consumers that parse numbers as doubles would round them.
func (g *globals) render(v any, header []string, rows func() [][]string) error {
	switch g.output {
	case "json":
		enc := json.NewEncoder(g.stdout)
		enc.SetIndent("", "  ")
		return enc.Encode(v)
	case "yaml":
		return writeYAML(g, v)
	}
	tw := tabwriter.NewWriter(g.stdout, 0, 4, 2, ' ', 0)
	for i, h := range header {
		if i > 0 {
			fmt.Fprint(tw, "\t")
		}
		fmt.Fprint(tw, h)
	}
	fmt.Fprintln(tw)
	for _, row := range rows() {
		for i, cell := range row {
			if i > 0 {
				fmt.Fprint(tw, "\t")
			}
			fmt.Fprint(tw, cell)
		}
		fmt.Fprintln(tw)
	}
	return tw.Flush()
}

// writeYAML writes v as YAML with the same keys, order and values as its
// JSON (JSON is YAML: parsed into a node tree, then written in block
// style), so that the two formats never disagree.
func writeYAML(g *globals, v any) error {
	b, err := json.Marshal(v)
	if err != nil {
		return err
	}
	var doc yaml.Node
	if err := yaml.Unmarshal(b, &doc); err != nil {
		return err
	}
	blockStyle(&doc)
	var out bytes.Buffer
	enc := yaml.NewEncoder(&out)
	enc.SetIndent(2)
	if err := enc.Encode(&doc); err != nil {
		return err
	}
	if err := enc.Close(); err != nil {
		return err
	}
	_, err = g.stdout.Write(out.Bytes())
	return err
}

// blockStyle drops the flow and quoting styles JSON's syntax gave the
// nodes; the encoder quotes again whatever a plain scalar would misread
// (a string "42" stays a string).
func blockStyle(n *yaml.Node) {
	n.Style = 0
	for _, c := range n.Content {
		blockStyle(c)
	}
}
