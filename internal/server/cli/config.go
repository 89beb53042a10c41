package cli

import (
	"bytes"
	"encoding/json"
	"flag"
	"os"
	"sort"
	"strconv"
	"strings"

	"github.com/cockroachdb/errors"
	"sigs.k8s.io/yaml"
)

// ConfigFlag is the flag ParseFlagsWithConfig adds: --config FILE.
const ConfigFlag = "config"

// ParseFlagsWithConfig is ParseFlags with a --config FILE flag added to fs.
// The file is YAML, one key per flag, named exactly like the flag (without
// dashes); it sets every flag the command line does not set, so the
// command line overrides the file. See ApplyConfigFile for the values. fs
// must not define a flag named "config" itself.
//
// The file is applied after the command line, to the flags it left unset,
// rather than before it: a flag whose Set accumulates (a fs.Func that
// appends) would otherwise get the file's value and the command line's.
func ParseFlagsWithConfig(fs *flag.FlagSet, args []string) error {
	path := fs.String(ConfigFlag, "", "YAML `file` of flag values, keys named like the flags; flags given on the command line override it")
	if err := ParseFlags(fs, args); err != nil {
		return err
	}
	given := false
	fs.Visit(func(f *flag.Flag) { given = given || f.Name == ConfigFlag })
	switch {
	case !given:
		return nil
	case *path == "":
		return Usagef("--%s: empty file name", ConfigFlag)
	}
	return ApplyConfigFile(fs, *path)
}

// ApplyConfigFile sets the flags of fs from the YAML file at path, skipping
// flags already set (by the command line). The file is a mapping from flag
// names to values: a scalar (string, number, boolean) is passed to the
// flag's Set as written; a list of scalars is joined with "," (for flags
// that take comma lists). Every error is a UsageError naming the file: a
// file that cannot be read or is not such a mapping, a duplicate key, a key
// that is no flag of fs, the key "config" itself, and a value the flag
// rejects (naming the key).
func ApplyConfigFile(fs *flag.FlagSet, path string) error {
	raw, err := os.ReadFile(path)
	if err != nil {
		return Usagef("--%s: %w", ConfigFlag, err)
	}
	return applyConfig(fs, path, raw)
}

// applyConfig is ApplyConfigFile for the contents raw of the file at path.
func applyConfig(fs *flag.FlagSet, path string, raw []byte) error {
	vals, err := parseConfig(raw)
	if err != nil {
		return Usagef("--%s %s: %v", ConfigFlag, path, err)
	}
	set := map[string]bool{}
	fs.Visit(func(f *flag.Flag) { set[f.Name] = true })
	keys := make([]string, 0, len(vals))
	for k := range vals {
		keys = append(keys, k)
	}
	sort.Strings(keys)
	for _, k := range keys {
		switch {
		case k == ConfigFlag:
			return Usagef("--%s %s: key %q: a configuration file cannot name another", ConfigFlag, path, k)
		case fs.Lookup(k) == nil:
			return Usagef("--%s %s: unknown key %q (not a flag of %s)", ConfigFlag, path, k, fs.Name())
		}
		v, err := configValue(vals[k])
		if err != nil {
			return Usagef("--%s %s: key %q: %v", ConfigFlag, path, k, err)
		}
		if set[k] {
			continue // the command line wins
		}
		if err := fs.Set(k, v); err != nil {
			return Usagef("--%s %s: key %q: invalid value %q: %v", ConfigFlag, path, k, v, err)
		}
	}
	return nil
}

// parseConfig decodes a YAML mapping, keeping numbers as written.
func parseConfig(raw []byte) (map[string]any, error) {
	js, err := yaml.YAMLToJSONStrict(raw)
	if err != nil {
		return nil, err
	}
	dec := json.NewDecoder(bytes.NewReader(js))
	dec.UseNumber()
	var top any
	if err := dec.Decode(&top); err != nil {
		return nil, err
	}
	switch m := top.(type) {
	case nil:
		return nil, nil // an empty file sets nothing
	case map[string]any:
		return m, nil
	}
	return nil, errors.Newf("want a mapping of flag names to values")
}

// configValue is the flag value for one YAML value.
func configValue(v any) (string, error) {
	if l, ok := v.([]any); ok {
		items := make([]string, len(l))
		for i, e := range l {
			s, err := scalar(e)
			if err != nil {
				return "", errors.Newf("list item %d: %w", i+1, err)
			}
			items[i] = s
		}
		return strings.Join(items, ","), nil
	}
	return scalar(v)
}

func scalar(v any) (string, error) {
	switch v := v.(type) {
	case string:
		return v, nil
	case json.Number:
		return v.String(), nil
	case bool:
		return strconv.FormatBool(v), nil
	case nil:
		return "", errors.Newf("no value")
	}
	return "", errors.Newf("want a string, number, boolean or a list of them")
}
