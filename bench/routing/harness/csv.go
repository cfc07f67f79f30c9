package harness

import (
	"encoding/csv"
	"errors"
	"fmt"
	"io"
	"os"
	"strconv"
	"time"
)

// CSVHeader names the columns of one result row.
func CSVHeader() []string {
	return []string{"profile", "seed", "workload", "load_kind", "load", "policy",
		"requests", "errors", "ttft_p50_s", "ttft_p90_s", "ttft_p99_s", "itl_p50_s", "e2e_p90_s",
		"out_tok_per_s", "prompt_tokens", "cached_tokens", "cached_ratio", "load_max_mean", "req_max_mean",
		"duration_s", "first_error"}
}

func f4(v float64) string { return strconv.FormatFloat(v, 'f', 4, 64) }

// Row is r as CSV cells.
func (r Result) Row() []string {
	return []string{r.Profile.Name, strconv.FormatUint(r.Seed, 10), r.Workload, r.Load.Kind(), strconv.FormatFloat(r.Load.Value(), 'g', -1, 64), r.Policy,
		strconv.Itoa(r.Requests), strconv.Itoa(r.Errors), f4(r.TTFTp50), f4(r.TTFTp90), f4(r.TTFTp99), f4(r.ITLp50), f4(r.E2Ep90),
		f4(r.OutTokPerS), strconv.Itoa(r.PromptTokens), strconv.Itoa(r.CachedTok), f4(r.CachedRatio), f4(r.LoadMaxMean), f4(r.ReqMaxMean),
		f4(r.Duration), firstLine(r.FirstError)}
}

// ReadResults parses a results CSV; a missing file is no results. Rows from
// an interrupted write (short or unparsable) are skipped, so a rerun redoes
// that point.
func ReadResults(path string) ([]Result, error) {
	f, err := os.Open(path)
	if errors.Is(err, os.ErrNotExist) {
		return nil, nil
	}
	if err != nil {
		return nil, fmt.Errorf("results: %w", err)
	}
	defer f.Close()
	rd := csv.NewReader(f)
	rd.FieldsPerRecord = -1
	var out []Result
	for line := 0; ; line++ {
		rec, err := rd.Read()
		if errors.Is(err, io.EOF) {
			break
		}
		if err != nil {
			continue
		}
		if line == 0 && len(rec) > 0 && rec[0] == CSVHeader()[0] {
			continue
		}
		r, ok := parseRow(rec)
		if ok {
			out = append(out, r)
		}
	}
	return out, nil
}

func parseRow(c []string) (Result, bool) {
	if len(c) != len(CSVHeader()) {
		return Result{}, false
	}
	var r Result
	var errs []error
	atoi := func(s string) int { v, err := strconv.Atoi(s); errs = append(errs, err); return v }
	atof := func(s string) float64 { v, err := strconv.ParseFloat(s, 64); errs = append(errs, err); return v }
	r.Profile = Profile{Name: c[0]}
	seed, err := strconv.ParseUint(c[1], 10, 64)
	errs = append(errs, err)
	r.Seed = seed
	r.Workload = c[2]
	lv := atof(c[4])
	if c[3] == "conc" {
		r.Load = Load{Concurrency: int(lv)}
	} else {
		r.Load = Load{QPS: lv}
	}
	r.Policy = c[5]
	r.Requests, r.Errors = atoi(c[6]), atoi(c[7])
	r.TTFTp50, r.TTFTp90, r.TTFTp99, r.ITLp50, r.E2Ep90 = atof(c[8]), atof(c[9]), atof(c[10]), atof(c[11]), atof(c[12])
	r.OutTokPerS = atof(c[13])
	r.PromptTokens, r.CachedTok = atoi(c[14]), atoi(c[15])
	r.CachedRatio, r.LoadMaxMean, r.ReqMaxMean, r.Duration = atof(c[16]), atof(c[17]), atof(c[18]), atof(c[19])
	r.FirstError = c[20]
	for _, e := range errs {
		if e != nil {
			return Result{}, false
		}
	}
	return r, true
}

// AppendResult writes one row and syncs it, so a killed run loses at most
// the point in progress.
func AppendResult(path string, r Result) error {
	_, statErr := os.Stat(path)
	f, err := os.OpenFile(path, os.O_CREATE|os.O_APPEND|os.O_WRONLY, 0o644)
	if err != nil {
		return fmt.Errorf("results: %w", err)
	}
	defer f.Close()
	w := csv.NewWriter(f)
	if errors.Is(statErr, os.ErrNotExist) {
		_ = w.Write(CSVHeader())
	}
	_ = w.Write(r.Row())
	w.Flush()
	if err := w.Error(); err != nil {
		return fmt.Errorf("results: %w", err)
	}
	return f.Sync()
}

// EstimateDuration is a rough wall time for a point: the trace at its rate
// plus fleet start-up and drain.
func EstimateDuration(pt Point) time.Duration {
	d := 4 * time.Second
	if pt.Load.QPS > 0 {
		d += time.Duration(float64(pt.Shape.Requests) / pt.Load.QPS * scale(pt.Profile) * float64(time.Second))
	} else {
		d += time.Duration(float64(pt.Shape.Requests) / float64(max(1, pt.Load.Concurrency)) * scale(pt.Profile) * float64(time.Second))
	}
	return d
}
