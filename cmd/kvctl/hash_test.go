package main

import (
	"bytes"
	"encoding/json"
	"errors"
	"os"
	"path/filepath"
	"strconv"
	"strings"
	"testing"

	"github.com/spf13/cobra"
	"github.com/spf13/pflag"
)

// parityRun executes kvctl in-process with fresh flag values and returns
// stdout, stderr and the error main would turn into the exit code.
func parityRun(t *testing.T, args ...string) (stdout, stderr string, err error) {
	t.Helper()
	var reset func(c *cobra.Command)
	reset = func(c *cobra.Command) {
		c.Flags().VisitAll(func(f *pflag.Flag) {
			_ = f.Value.Set(f.DefValue)
			f.Changed = false
		})
		for _, sub := range c.Commands() {
			reset(sub)
		}
	}
	reset(root)
	var out, errb bytes.Buffer
	root.SetArgs(args)
	root.SetOut(&out)
	root.SetErr(&errb)
	root.SetFlagErrorFunc(func(_ *cobra.Command, err error) error { return &inputError{msg: err.Error()} })
	err = root.Execute()
	return out.String(), errb.String(), err
}

// parityExitCode is the exit code main would use for err.
func parityExitCode(err error) int {
	var in *inputError
	switch {
	case err == nil:
		return 0
	case errors.As(err, &in):
		return 2
	}
	return 1
}

type hashOutput struct {
	Algo      string `json:"algo"`
	BlockSize int    `json:"block_size"`
	NoneHash  string `json:"none_hash"`
	Blocks    []struct {
		Index  int    `json:"index"`
		Digest string `json:"digest"`
		Hash   uint64 `json:"hash"`
	} `json:"blocks"`
}

func parseHashOutput(t *testing.T, stdout string) hashOutput {
	t.Helper()
	if strings.Count(stdout, "\n") != 1 {
		t.Fatalf("want exactly one JSON line, got %q", stdout)
	}
	var out hashOutput
	dec := json.NewDecoder(strings.NewReader(stdout))
	dec.DisallowUnknownFields()
	if err := dec.Decode(&out); err != nil {
		t.Fatalf("output %q: %v", stdout, err)
	}
	return out
}

func joinTokens(ts []uint32) string {
	parts := make([]string, len(ts))
	for i, v := range ts {
		parts[i] = strconv.FormatUint(uint64(v), 10)
	}
	return strings.Join(parts, ",")
}

// TestHashCommandVectors runs every vLLM hash vector through kvctl hash.
func TestHashCommandVectors(t *testing.T) {
	raw, err := os.ReadFile("../../pkg/kvhash/testdata/vllm_hash_vectors.json")
	if err != nil {
		t.Fatal(err)
	}
	var v struct {
		Sequences map[string][]uint32 `json:"sequences"`
		NoneHash  []struct {
			Algo, Pythonhashseed string
			NoneHashHex          string `json:"none_hash_hex"`
		} `json:"none_hash"`
		Cases []struct {
			Algo          string `json:"algo"`
			Seed          string `json:"pythonhashseed"`
			BlockSize     int    `json:"block_size"`
			Sequence      string `json:"sequence"`
			RequestExtras *struct {
				LoRAName  *string `json:"lora_name"`
				CacheSalt *string `json:"cache_salt"`
			} `json:"request_extras"`
			Blocks []struct {
				Index     int    `json:"index"`
				DigestHex string `json:"digest_hex"`
				WireU64   uint64 `json:"wire_u64"`
			} `json:"blocks"`
		} `json:"cases"`
	}
	if err := json.Unmarshal(raw, &v); err != nil {
		t.Fatal(err)
	}
	dir := t.TempDir()
	for i, c := range v.Cases {
		args := []string{"hash", "--algo", c.Algo, "--block-size", strconv.Itoa(c.BlockSize), "--seed", c.Seed}
		if c.RequestExtras != nil {
			if c.RequestExtras.LoRAName != nil {
				args = append(args, "--lora-name", *c.RequestExtras.LoRAName)
			}
			if c.RequestExtras.CacheSalt != nil {
				args = append(args, "--cache-salt", *c.RequestExtras.CacheSalt)
			}
		}
		tokens := v.Sequences[c.Sequence]
		// Alternate between --tokens and --tokens-file.
		if i%2 == 0 {
			args = append(args, "--tokens", joinTokens(tokens))
		} else {
			path := filepath.Join(dir, strconv.Itoa(i)+".json")
			b, _ := json.Marshal(tokens)
			if tokens == nil {
				b = []byte("[]")
			}
			if err := os.WriteFile(path, b, 0o600); err != nil {
				t.Fatal(err)
			}
			args = append(args, "--tokens-file", path)
		}
		stdout, stderr, err := parityRun(t, args...)
		if err != nil {
			t.Fatalf("case %d %v: %v (%s)", i, args[:7], err, stderr)
		}
		out := parseHashOutput(t, stdout)
		if out.Algo != c.Algo || out.BlockSize != c.BlockSize || len(out.Blocks) != len(c.Blocks) {
			t.Fatalf("case %d: %+v", i, out)
		}
		for j, b := range c.Blocks {
			got := out.Blocks[j]
			if got.Index != b.Index || got.Digest != b.DigestHex || got.Hash != b.WireU64 {
				t.Errorf("case %d block %d: %+v, want %s/%d", i, j, got, b.DigestHex, b.WireU64)
			}
		}
		if !strings.Contains(stdout, `"blocks":[`) {
			t.Errorf("case %d: blocks is not an array: %s", i, stdout)
		}
	}
	// NONE_HASH for each algorithm and seed, including unset = "vllm-none-hash".
	for _, nh := range v.NoneHash {
		stdout, _, err := parityRun(t, "hash", "--algo", nh.Algo, "--block-size", "16", "--seed", nh.Pythonhashseed, "--tokens", "")
		if err != nil || parseHashOutput(t, stdout).NoneHash != nh.NoneHashHex {
			t.Errorf("%s seed %q: %s %v", nh.Algo, nh.Pythonhashseed, stdout, err)
		}
	}
}

func TestHashSeedSources(t *testing.T) {
	const (
		seed0        = "4e1195df020de59e0d65a33a4279f1183e7ae4e5d980e309f8b55adff2e61c3e"
		vllmNoneHash = "9bd96a485ad84efdafb72ee48a1d7a69bcead0f8f0433173941b276b9581eef0"
	)
	t.Setenv(hashEnvSeed, "0")
	stdout, _, err := parityRun(t, "hash", "--tokens", "1")
	if err != nil || parseHashOutput(t, stdout).NoneHash != seed0 {
		t.Errorf("env seed 0: %s %v", stdout, err)
	}
	// --seed wins over the environment, and the empty string is a seed.
	stdout, _, err = parityRun(t, "hash", "--seed", "", "--tokens", "1")
	if err != nil {
		t.Fatal(err)
	}
	emptyNone := parseHashOutput(t, stdout).NoneHash
	if emptyNone == seed0 || emptyNone == vllmNoneHash {
		t.Errorf("--seed \"\" gave %s", emptyNone)
	}
	t.Setenv(hashEnvSeed, "")
	stdout, _, _ = parityRun(t, "hash", "--tokens", "1")
	if parseHashOutput(t, stdout).NoneHash != emptyNone {
		t.Errorf("empty env seed is not the empty seed: %s", stdout)
	}
	os.Unsetenv(hashEnvSeed)
	stdout, _, err = parityRun(t, "hash", "--tokens", "1")
	if err != nil || parseHashOutput(t, stdout).NoneHash != vllmNoneHash {
		t.Errorf("unset seed (sha256_cbor) should be vllm-none-hash: %s %v", stdout, err)
	}
	_, stderr, err := parityRun(t, "hash", "--algo", "xxhash_cbor", "--tokens", "1")
	if parityExitCode(err) != 2 || !strings.Contains(err.Error(), "--seed") || !strings.Contains(err.Error(), "random") {
		t.Errorf("unset seed with xxhash: %v %s", err, stderr)
	}
}

func TestHashBadInput(t *testing.T) {
	dir := t.TempDir()
	write := func(name, body string) string {
		p := filepath.Join(dir, name)
		if err := os.WriteFile(p, []byte(body), 0o600); err != nil {
			t.Fatal(err)
		}
		return p
	}
	tests := []struct {
		name string
		args []string
		flag string
	}{
		{"non-numeric token", []string{"--tokens", "1,two,3"}, "--tokens"},
		{"negative token", []string{"--tokens", "1,-2"}, "--tokens"},
		{"negative first token", []string{"--tokens=-1"}, "--tokens"},
		{"token too large", []string{"--tokens", "4294967296"}, "--tokens"},
		{"empty element", []string{"--tokens", "1,,2"}, "--tokens"},
		{"unknown algo", []string{"--algo", "md5", "--tokens", "1"}, "--algo"},
		{"algo names are case-sensitive, as in vLLM", []string{"--algo", "SHA256_CBOR", "--tokens", "1"}, "--algo"},
		{"algo name with spaces", []string{"--algo", " sha256", "--tokens", "1"}, "--algo"},
		{"sglang takes no seed", []string{"--algo", "sha256_sglang", "--seed", "0", "--tokens", "1"}, "--seed"},
		{"trtllm takes no seed", []string{"--algo", "blockhash_trtllm", "--seed", "0", "--tokens", "1"}, "--seed"},
		{"lora task id is trtllm's", []string{"--algo", "sha256_sglang", "--lora-task-id", "3", "--tokens", "1"}, "--lora-task-id"},
		{"lora task id not for vllm", []string{"--seed", "0", "--lora-task-id", "3", "--tokens", "1"}, "--lora-task-id"},
		{"trtllm hashes no lora name", []string{"--algo", "blockhash_trtllm", "--lora-name", "a", "--tokens", "1"}, "--lora-name"},
		{"trtllm token above uint32", []string{"--algo", "blockhash_trtllm", "--tokens", "1,4294967296"}, "--tokens"},
		{"sglang token above int64", []string{"--algo", "sha256_sglang", "--tokens", "9223372036854775808"}, "--tokens"},
		{"token above uint64", []string{"--algo", "sha256_sglang", "--tokens", "18446744073709551616"}, "--tokens"},
		{"lora task id negative", []string{"--algo", "blockhash_trtllm", "--lora-task-id", "-1", "--tokens", "1"}, "--lora-task-id"},
		{"block size 0", []string{"--block-size", "0", "--tokens", "1"}, "--block-size"},
		{"block size negative", []string{"--block-size", "-16", "--tokens", "1"}, "--block-size"},
		{"block size not a number", []string{"--block-size", "x", "--tokens", "1"}, "--block-size"},
		{"xxhash unset seed", []string{"--algo", "xxhash", "--tokens", "1"}, "--seed"},
		{"no tokens", []string{"--seed", "0"}, "--tokens"},
		{"both token sources", []string{"--tokens", "1", "--tokens-file", "x"}, "--tokens-file"},
		{"missing file", []string{"--tokens-file", filepath.Join(dir, "nope.json")}, "--tokens-file"},
		{"file not JSON", []string{"--tokens-file", write("a.json", "1,2,3")}, "--tokens-file"},
		{"file with float", []string{"--tokens-file", write("b.json", "[1, 2.5]")}, "--tokens-file"},
		{"file with negative", []string{"--tokens-file", write("c.json", "[1, -2]")}, "--tokens-file"},
		{"file with string", []string{"--tokens-file", write("d.json", `[1, "2"]`)}, "--tokens-file"},
		{"file with object", []string{"--tokens-file", write("e.json", `{"a":1}`)}, "--tokens-file"},
		{"file with trailing data", []string{"--tokens-file", write("f.json", `[1] [2]`)}, "--tokens-file"},
		{"file null", []string{"--tokens-file", write("g.json", `null`)}, "--tokens-file"},
		{"positional argument", []string{"--tokens", "1", "2,3"}, "unexpected argument"},
	}
	os.Unsetenv(hashEnvSeed)
	for _, tt := range tests {
		t.Run(tt.name, func(t *testing.T) {
			stdout, _, err := parityRun(t, append([]string{"hash"}, tt.args...)...)
			if parityExitCode(err) != 2 {
				t.Fatalf("exit %d (err %v), want 2", parityExitCode(err), err)
			}
			if !strings.Contains(err.Error(), tt.flag) {
				t.Errorf("error %q does not name %s", err, tt.flag)
			}
			if stdout != "" {
				t.Errorf("printed %q on bad input", stdout)
			}
		})
	}
}

func TestHashDebugEnv(t *testing.T) {
	t.Setenv(hashEnvDebug, "1")
	stdout, stderr, err := parityRun(t, "hash", "--seed", "0", "--block-size", "2", "--tokens", "1,2,3,4,5")
	if err != nil {
		t.Fatal(err)
	}
	out := parseHashOutput(t, stdout)
	lines := strings.Split(strings.TrimSpace(stderr), "\n")
	if len(lines) != 2 {
		t.Fatalf("debug lines %q", stderr)
	}
	for i, l := range lines {
		if !strings.Contains(l, "blk="+strconv.Itoa(i)) || !strings.Contains(l, "u64="+strconv.FormatUint(out.Blocks[i].Hash, 10)) || !strings.Contains(l, "input=83") {
			t.Errorf("debug line %q", l)
		}
	}
	t.Setenv(hashEnvDebug, "true") // only "1" turns it on
	if _, stderr, _ := parityRun(t, "hash", "--seed", "0", "--tokens", "1"); stderr != "" {
		t.Errorf("debug output with %s=true: %q", hashEnvDebug, stderr)
	}
}

// TestHashEngines checks kvctl hash against values from
// pkg/kvhash/testdata/engines/engine_hash_vectors.json (executed from the
// engines' own code): SGLang's printed signed, TensorRT-LLM's unsigned.
func TestHashEngines(t *testing.T) {
	t.Setenv(hashEnvSeed, "ignored-by-these-algorithms")
	tests := []struct {
		name string
		args []string
		want string // the "hash" values as printed, comma-separated
	}{
		{"sglang chain, signed", []string{"--algo", "sha256_sglang", "--block-size", "2", "--tokens", "10,20,30,40,50,60,70,80"},
			"978178666101069530,-895308556211281782,-8033692805846017938,835415944263129316"},
		{"sglang partial page not hashed", []string{"--algo", "sha256_sglang", "--block-size", "4", "--tokens", "1,2,3,4,5"}, "-3488128144981237669"},
		{"sglang cache salt", []string{"--algo", "sha256_sglang", "--block-size", "2", "--cache-salt", "tenant-a", "--tokens", "1,2,3,4,5,6"},
			"31502315585564397,-6358338539514506595,6762951498854405880"},
		{"sglang lora", []string{"--algo", "sha256_sglang", "--block-size", "2", "--lora-name", "adapter-a", "--tokens", "1,2,3,4"},
			"1132550695741458728,3694048958605100876"},
		{"sglang wide token", []string{"--algo", "sha256_sglang", "--block-size", "2", "--tokens", "1,2,4294967296,4,5,6"},
			"3817746824117602890,-1958916491314697310,-3888089868545434748"},
		{"trtllm chain, unsigned", []string{"--algo", "blockhash_trtllm", "--block-size", "4", "--tokens", "5,6,7,8,9,10,11,12"},
			"846258687882670,12303986897875515513"},
		{"trtllm lora task id", []string{"--algo", "blockhash_trtllm", "--block-size", "4", "--lora-task-id", "7", "--tokens", "1,2,3,4,5,6,7,8"},
			"1405807694910447675,13794850255392118621"},
		{"trtllm salt", []string{"--algo", "blockhash_trtllm", "--block-size", "4", "--cache-salt", "tenant-a", "--tokens", "1,2,3,4,5,6,7,8"},
			"8961321873627678067,10690226908068462878"},
		{"trtllm no trimming", []string{"--algo", "blockhash_trtllm", "--block-size", "1", "--tokens", "3,1,4"},
			"2112769087,2828147860025794695,1851430847878620931"},
	}
	for _, tt := range tests {
		t.Run(tt.name, func(t *testing.T) {
			stdout, stderr, err := parityRun(t, append([]string{"hash"}, tt.args...)...)
			if err != nil {
				t.Fatalf("%v %s", err, stderr)
			}
			var out struct {
				Blocks []struct {
					Hash json.Number `json:"hash"`
				} `json:"blocks"`
			}
			dec := json.NewDecoder(strings.NewReader(stdout))
			dec.UseNumber()
			if err := dec.Decode(&out); err != nil {
				t.Fatalf("output %q: %v", stdout, err)
			}
			got := make([]string, len(out.Blocks))
			for i, b := range out.Blocks {
				got[i] = b.Hash.String()
			}
			if strings.Join(got, ",") != tt.want {
				t.Errorf("hashes %s, want %s", strings.Join(got, ","), tt.want)
			}
		})
	}
}
