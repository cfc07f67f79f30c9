package main

import (
	"bufio"
	"bytes"
	"encoding/json"
	"io"
	"os"
	"strconv"

	"github.com/spf13/cobra"

	"github.com/kvgate/kvgate/pkg/chattemplate"
	"github.com/kvgate/kvgate/pkg/tokenizer"
)

// tokenizeMaxInput bounds one input file (and one line of it).
const tokenizeMaxInput = 256 << 20

func init() { root.AddCommand(newTokenizeCmd()) }

// loadTokenizerModel loads --tokenizer PATH; tests swap in a memoizing loader.
var loadTokenizerModel = func(path string) (*tokenizer.Model, error) { return tokenizer.LoadModel(path) }

type tokenizeFlags struct {
	tokenizer, text, jsonl, chat, kwargs, tools string
	addSpecial, render, addGenPrompt, cont      bool
	toolsStrict                                 bool
}

func newTokenizeCmd() *cobra.Command {
	var fl tokenizeFlags
	c := &cobra.Command{
		Use:   "tokenize --tokenizer PATH (--text S | --jsonl F | --chat F) [flags]",
		Short: "Tokenize text or chats exactly as vLLM does (HuggingFace tokenizer.json, chat templates)",
		Long: `tokenize prints the token ids kvgate computes for a prompt, the ids vLLM
computes for the same request.

PATH is a tokenizer.json (tokenizer_config.json is looked for beside it) or a
directory holding both, e.g. a staging directory /etc/loxilb/tokenizers/<slug>.

Text:  --text S prints one JSON array of ids. --jsonl F reads one JSON string
       per line (as in corpus.jsonl) and prints one JSON array per line, in
       order. --add-special-tokens adds what /v1/completions adds (e.g. a BOS,
       when the tokenizer's post-processor or add_bos_token says so); the
       default is false.
Chat:  --chat F reads a JSON array of messages, or JSONL of such arrays, renders
       each with the model's chat template (as vLLM's /v1/chat/completions
       does: add_generation_prompt true, text parts joined with "\n") and
       prints its ids, encoded without special tokens; with --render it prints
       the rendered prompt as one JSON string per line instead.
       --chat-template-kwargs '{"enable_thinking": false}' and --tools F2 (a
       JSON array of OpenAI tools) are passed to the template.

A line that cannot be read or rendered stops the run with exit code 2 and
names its line number: skipping it would misalign the output.`,
		Example: `  kvctl tokenize --tokenizer /etc/loxilb/tokenizers/Qwen__Qwen3-0.6B --text 'Hello world'
  kvctl tokenize --tokenizer tokenizer.json --jsonl corpus.jsonl > corpus.ids
  kvctl tokenize --tokenizer ./qwen3 --chat chats.jsonl --chat-template-kwargs '{"enable_thinking":false}'`,
		Args: parityNoArgs,
		RunE: func(cmd *cobra.Command, _ []string) error { return runTokenize(cmd, &fl) },
	}
	f := c.Flags()
	f.StringVar(&fl.tokenizer, "tokenizer", "", "tokenizer.json file or directory (required)")
	f.StringVar(&fl.text, "text", "", "text to tokenize")
	f.StringVar(&fl.jsonl, "jsonl", "", `file with one JSON string per line ("-" for stdin)`)
	f.BoolVar(&fl.addSpecial, "add-special-tokens", false, "add the special tokens vLLM's completions add (e.g. BOS)")
	f.StringVar(&fl.chat, "chat", "", `file with a JSON array of messages, or JSONL of such arrays ("-" for stdin)`)
	f.BoolVar(&fl.render, "render", false, "with --chat: print the rendered prompt instead of ids")
	f.StringVar(&fl.kwargs, "chat-template-kwargs", "", "with --chat: JSON object of chat_template_kwargs")
	f.StringVar(&fl.tools, "tools", "", "with --chat: file holding a JSON array of tools")
	f.BoolVar(&fl.toolsStrict, "tools-strict-field", false, `with --tools: vLLM releases whose tool schema has "strict"`)
	f.BoolVar(&fl.addGenPrompt, "add-generation-prompt", true, "with --chat: add_generation_prompt")
	f.BoolVar(&fl.cont, "continue-final-message", false, "with --chat: continue_final_message")
	return c
}

func runTokenize(cmd *cobra.Command, fl *tokenizeFlags) error {
	if fl.tokenizer == "" {
		return badInput("tokenize: --tokenizer PATH is required")
	}
	modes := 0
	for _, set := range []bool{cmd.Flags().Changed("text"), fl.jsonl != "", fl.chat != ""} {
		if set {
			modes++
		}
	}
	if modes != 1 {
		return badInput("tokenize: give exactly one of --text, --jsonl, --chat")
	}
	if fl.chat == "" && (fl.render || fl.kwargs != "" || fl.tools != "") {
		return badInput("tokenize: --render, --chat-template-kwargs and --tools need --chat")
	}
	m, err := loadTokenizerModel(fl.tokenizer)
	if err != nil {
		// Missing, unreadable, malformed or unsupported: all are bad input
		// (exit 2), like every other flag value kvctl rejects.
		return badInput("--tokenizer %s: %v", fl.tokenizer, err)
	}
	out := bufio.NewWriter(cmd.OutOrStdout())
	defer out.Flush()
	switch {
	case cmd.Flags().Changed("text"):
		ids, err := m.EncodePrompt(fl.text, &fl.addSpecial)
		if err != nil {
			return badInput("--text: %v", err)
		}
		return writeIDs(out, ids)
	case fl.jsonl != "":
		return eachLine(cmd, "--jsonl", fl.jsonl, func(n int, line []byte) error {
			var s string
			if err := json.Unmarshal(line, &s); err != nil {
				return badInput("%s line %d: want one JSON string: %v", fl.jsonl, n, err)
			}
			ids, err := m.EncodePrompt(s, &fl.addSpecial)
			if err != nil {
				return badInput("%s line %d: %v", fl.jsonl, n, err)
			}
			return writeIDs(out, ids)
		})
	}
	return runTokenizeChat(cmd, fl, m, out)
}

func runTokenizeChat(cmd *cobra.Command, fl *tokenizeFlags, m *tokenizer.Model, out *bufio.Writer) error {
	base := tokenizer.ChatRequest{AddGenerationPrompt: &fl.addGenPrompt, ContinueFinalMessage: fl.cont, AddSpecialTokens: fl.addSpecial}
	if fl.kwargs != "" {
		v, err := chattemplate.DecodeJSON([]byte(fl.kwargs))
		if err != nil {
			return badInput("--chat-template-kwargs: %v", err)
		}
		d, ok := v.(*chattemplate.Dict)
		if !ok {
			return badInput("--chat-template-kwargs: want a JSON object")
		}
		base.ChatTemplateKwargs = map[string]any{}
		for _, k := range d.Keys() {
			base.ChatTemplateKwargs[k], _ = d.Get(k)
		}
	}
	if fl.tools != "" {
		data, err := readInput(cmd, "--tools", fl.tools)
		if err != nil {
			return err
		}
		v, err := chattemplate.DecodeJSON(data)
		if err != nil {
			return badInput("--tools %s: %v", fl.tools, err)
		}
		list, ok := v.([]any)
		if !ok {
			return badInput("--tools %s: want a JSON array of tools", fl.tools)
		}
		if base.Tools, err = chattemplate.VLLMToolDicts(list, fl.toolsStrict); err != nil {
			return badInput("--tools %s: %v", fl.tools, err)
		}
	}
	emit := func(where string, msgs []map[string]any) error {
		req := base
		req.Messages = msgs
		if fl.render {
			rendered, err := m.RenderChat(req)
			if err != nil {
				return badInput("%s: %v", where, err)
			}
			enc := json.NewEncoder(out) // one JSON string per line, "<" kept as is
			enc.SetEscapeHTML(false)
			return enc.Encode(rendered)
		}
		ids, _, err := m.EncodeChat(req)
		if err != nil {
			return badInput("%s: %v", where, err)
		}
		return writeIDs(out, ids)
	}
	// One JSON array (possibly spread over lines), or JSONL of arrays.
	data, err := readInput(cmd, "--chat", fl.chat)
	if err != nil {
		return err
	}
	if trimmed := bytes.TrimSpace(data); len(trimmed) > 0 && json.Valid(trimmed) {
		msgs, err := chattemplate.DecodeMessages(trimmed)
		if err != nil {
			return badInput("%s: %v", fl.chat, err)
		}
		return emit(fl.chat, msgs)
	}
	return scanLines(fl.chat, bytes.NewReader(data), func(n int, line []byte) error {
		msgs, err := chattemplate.DecodeMessages(line)
		if err != nil {
			return badInput("%s line %d: want a JSON array of messages: %v", fl.chat, n, err)
		}
		return emit(fl.chat+" line "+strconv.Itoa(n), msgs)
	})
}

func writeIDs(w io.Writer, ids []uint32) error {
	buf := make([]byte, 0, len(ids)*7+2)
	buf = append(buf, '[')
	for i, id := range ids {
		if i > 0 {
			buf = append(buf, ',')
		}
		buf = strconv.AppendUint(buf, uint64(id), 10)
	}
	buf = append(buf, ']', '\n')
	_, err := w.Write(buf)
	return err
}

// readInput reads a whole file ("-" for stdin), bounded; errors name flag.
func readInput(cmd *cobra.Command, flag, path string) ([]byte, error) {
	r, closeInput, err := openInput(cmd, flag, path)
	if err != nil {
		return nil, err
	}
	defer closeInput()
	data, err := io.ReadAll(io.LimitReader(r, tokenizeMaxInput+1))
	if err != nil {
		return nil, badInput("%s: read %s: %v", flag, path, err)
	}
	if len(data) > tokenizeMaxInput {
		return nil, badInput("%s %s: larger than %d bytes", flag, path, tokenizeMaxInput)
	}
	return data, nil
}

func eachLine(cmd *cobra.Command, flag, path string, fn func(n int, line []byte) error) error {
	r, closeInput, err := openInput(cmd, flag, path)
	if err != nil {
		return err
	}
	defer closeInput()
	return scanLines(path, r, fn)
}

// openInput opens path for reading, or stdin for "-"; an error names flag.
func openInput(cmd *cobra.Command, flag, path string) (io.Reader, func(), error) {
	if path == "-" {
		return cmd.InOrStdin(), func() {}, nil
	}
	f, err := os.Open(path)
	if err != nil {
		return nil, nil, badInput("%s: %v", flag, err)
	}
	return f, func() { f.Close() }, nil
}

// scanLines calls fn for each line (1-based numbers). An empty line is bad
// input: it would shift every later output line.
func scanLines(path string, r io.Reader, fn func(n int, line []byte) error) error {
	sc := bufio.NewScanner(r)
	sc.Buffer(make([]byte, 64<<10), tokenizeMaxInput)
	n := 0
	for sc.Scan() {
		n++
		line := bytes.TrimRight(sc.Bytes(), "\r")
		if len(bytes.TrimSpace(line)) == 0 {
			return badInput("%s line %d: empty line", path, n)
		}
		if err := fn(n, line); err != nil {
			return err
		}
	}
	if err := sc.Err(); err != nil {
		return badInput("%s line %d: %v", path, n+1, err)
	}
	return nil
}
