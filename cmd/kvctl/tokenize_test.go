package main

import (
	"bytes"
	"errors"
	"os"
	"path/filepath"
	"strings"
	"sync"
	"testing"

	"github.com/kvgate/kvgate/pkg/tokenizer"
)

const tokTestdata = "../../pkg/tokenizer/testdata"

// Loading a real tokenizer takes about a second; the tests share loads.
func init() {
	var mu sync.Mutex
	loaded := map[string]*tokenizer.Model{}
	load := loadTokenizerModel
	loadTokenizerModel = func(path string) (*tokenizer.Model, error) {
		mu.Lock()
		defer mu.Unlock()
		if m, ok := loaded[path]; ok {
			return m, nil
		}
		m, err := load(path)
		if err == nil {
			loaded[path] = m
		}
		return m, err
	}
}

// tokenizeRun runs a fresh `tokenize` command (fresh flags) in-process.
func tokenizeRun(t *testing.T, stdin string, args ...string) (string, error) {
	t.Helper()
	c := newTokenizeCmd()
	var out, errb bytes.Buffer
	c.SetArgs(args)
	c.SetOut(&out)
	c.SetErr(&errb)
	c.SetIn(strings.NewReader(stdin))
	c.SilenceUsage, c.SilenceErrors = true, true
	err := c.Execute()
	return out.String(), err
}

func writeFile(t *testing.T, name, body string) string {
	t.Helper()
	p := filepath.Join(t.TempDir(), name)
	if err := os.WriteFile(p, []byte(body), 0o644); err != nil {
		t.Fatal(err)
	}
	return p
}

// TestTokenizeCorpus: --jsonl reproduces HuggingFace's ids line for line.
func TestTokenizeCorpus(t *testing.T) {
	for _, name := range []string{"qwen3", "llama3"} {
		want, err := os.ReadFile(filepath.Join(tokTestdata, "corpus."+name+".ids"))
		if err != nil {
			t.Fatal(err)
		}
		// PATH as a directory and as the tokenizer.json file.
		for _, path := range []string{filepath.Join(tokTestdata, name), filepath.Join(tokTestdata, name, "tokenizer.json")} {
			got, err := tokenizeRun(t, "", "--tokenizer", path, "--jsonl", filepath.Join(tokTestdata, "corpus.jsonl"))
			if err != nil {
				t.Fatal(err)
			}
			if got != string(want) {
				t.Fatalf("%s: output differs from corpus.%s.ids", path, name)
			}
		}
	}
}

func TestTokenizeText(t *testing.T) {
	qwen := filepath.Join(tokTestdata, "qwen3")
	cases := []struct {
		name string
		args []string
		want string
	}{
		{"text", []string{"--tokenizer", qwen, "--text", "Hello world, this is a test."}, "[9707,1879,11,419,374,264,1273,13]\n"},
		{"empty text", []string{"--tokenizer", qwen, "--text", ""}, "[]\n"},
		{"special tokens parsed", []string{"--tokenizer", qwen, "--text", "<|im_end|>"}, "[151645]\n"},
		{"qwen3 adds no BOS", []string{"--tokenizer", qwen, "--text", "Hello", "--add-special-tokens"}, "[9707]\n"},
		{"stdin jsonl", []string{"--tokenizer", qwen, "--jsonl", "-"}, "[9707]\n[14615]\n"},
	}
	for _, c := range cases {
		t.Run(c.name, func(t *testing.T) {
			stdin := ""
			if c.name == "stdin jsonl" {
				stdin = "\"Hello\"\n\"world\"\n"
			}
			got, err := tokenizeRun(t, stdin, c.args...)
			if err != nil {
				t.Fatal(err)
			}
			if got != c.want {
				t.Errorf("got %q want %q", got, c.want)
			}
		})
	}
}

func TestTokenizeChat(t *testing.T) {
	qwen := filepath.Join(tokTestdata, "qwen3")
	one := `[{"role": "user", "content": "hi"}]`
	// A pretty-printed single array, and JSONL of arrays.
	single := writeFile(t, "chat.json", "[\n  {\"role\": \"user\",\n   \"content\": \"hi\"}\n]\n")
	multi := writeFile(t, "chats.jsonl", one+"\n"+`[{"role": "system", "content": "S"}, {"role": "user", "content": "q"}]`+"\n")
	got, err := tokenizeRun(t, "", "--tokenizer", qwen, "--chat", single, "--render")
	if err != nil {
		t.Fatal(err)
	}
	if want := `"<|im_start|>user\nhi<|im_end|>\n<|im_start|>assistant\n"` + "\n"; got != want {
		t.Errorf("render %q", got)
	}
	got, err = tokenizeRun(t, "", "--tokenizer", qwen, "--chat", multi, "--render", "--chat-template-kwargs", `{"enable_thinking": false}`)
	if err != nil {
		t.Fatal(err)
	}
	lines := strings.Split(strings.TrimSpace(got), "\n")
	if len(lines) != 2 || !strings.Contains(lines[0], `<think>\n\n</think>\n\n`) || !strings.HasPrefix(lines[1], `"<|im_start|>system\nS<|im_end|>`) {
		t.Errorf("jsonl render:\n%s", got)
	}
	ids, err := tokenizeRun(t, "", "--tokenizer", qwen, "--chat", single)
	if err != nil {
		t.Fatal(err)
	}
	// <|im_start|> user \n hi <|im_end|> \n <|im_start|> assistant \n
	if want := "[151644,872,198,6023,151645,198,151644,77091,198]\n"; ids != want {
		t.Errorf("ids %q", ids)
	}
	tools := writeFile(t, "tools.json", `[{"type": "function", "function": {"name": "f", "description": "d", "parameters": {"type": "object", "properties": {}}}}]`)
	got, err = tokenizeRun(t, "", "--tokenizer", qwen, "--chat", single, "--render", "--tools", tools)
	if err != nil {
		t.Fatal(err)
	}
	if !strings.Contains(got, `# Tools`) || !strings.Contains(got, `\"name\": \"f\"`) {
		t.Errorf("tools render %q", got)
	}
}

// TestTokenizeBadInput: bad input exits 2 (inputError) and names the line.
func TestTokenizeBadInput(t *testing.T) {
	qwen := filepath.Join(tokTestdata, "qwen3")
	badJSONL := writeFile(t, "bad.jsonl", "\"ok\"\n\"ok\"\n{not a string}\n\"never reached\"\n")
	emptyLine := writeFile(t, "empty.jsonl", "\"ok\"\n\n\"x\"\n")
	badChat := writeFile(t, "bad.chat.jsonl", `[{"role":"user","content":"a"}]`+"\n"+`{"role":"user"}`+"\n")
	cases := []struct {
		name    string
		args    []string
		wantOut string
		wantErr string
	}{
		{"bad jsonl line", []string{"--tokenizer", qwen, "--jsonl", badJSONL}, "[562]\n[562]\n", "line 3"},
		{"empty line", []string{"--tokenizer", qwen, "--jsonl", emptyLine}, "[562]\n", "line 2"},
		{"bad chat line", []string{"--tokenizer", qwen, "--chat", badChat}, "", "line 2"},
		{"missing tokenizer", []string{"--tokenizer", "/nonexistent/x", "--text", "a"}, "", "nonexistent"},
		{"no mode", []string{"--tokenizer", qwen}, "", "exactly one"},
		{"two modes", []string{"--tokenizer", qwen, "--text", "a", "--jsonl", badJSONL}, "", "exactly one"},
		{"render without chat", []string{"--tokenizer", qwen, "--text", "a", "--render"}, "", "need --chat"},
		{"bad kwargs", []string{"--tokenizer", qwen, "--chat", badChat, "--chat-template-kwargs", "[1]"}, "", "JSON object"},
		{"missing jsonl", []string{"--tokenizer", qwen, "--jsonl", "/nonexistent.jsonl"}, "", "--jsonl"},
		{"missing chat file", []string{"--tokenizer", qwen, "--chat", "/nonexistent.json"}, "", "--chat"},
		{"missing tools file", []string{"--tokenizer", qwen, "--chat", badChat, "--tools", "/nonexistent.json"}, "", "--tools"},
		{"malformed tokenizer", []string{"--tokenizer", writeFile(t, "broken.json", "{not json"), "--text", "a"}, "", "--tokenizer"},
		{"unsupported model type", []string{"--tokenizer", writeFile(t, "unigram.json", `{"model":{"type":"Unigram","vocab":[]}}`), "--text", "a"}, "", "--tokenizer"},
		{"positional argument", []string{"--tokenizer", qwen, "--text", "a", "b"}, "", "unexpected argument"},
	}
	for _, c := range cases {
		t.Run(c.name, func(t *testing.T) {
			out, err := tokenizeRun(t, "", c.args...)
			var in *inputError
			if !errors.As(err, &in) {
				t.Fatalf("want inputError (exit 2), got %v", err)
			}
			if !strings.Contains(err.Error(), c.wantErr) {
				t.Errorf("error %q does not name %q", err, c.wantErr)
			}
			if c.wantOut != "" && out != c.wantOut {
				t.Errorf("output before the bad line %q, want %q", out, c.wantOut)
			}
		})
	}
}
