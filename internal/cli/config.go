package cli

import (
	"bufio"
	"errors"
	"fmt"
	"io/fs"
	"os"
	"strings"
)

// config is where the CLI calls and with which key.
type config struct{ url, apiKey string }

// configInputs are the flags as given; *Set says a flag was given (even as "").
type configInputs struct {
	url, apiKey, profile       string
	urlSet, keySet, profileSet bool
}

// profile is one [name] section of the profile file.
type profile struct{ url, apiKey string }

// resolveConfig picks the URL and the key, each on its own, first found wins: the flag; the
// profile --profile names; WB_URL / WB_API_KEY; the profile WB_PROFILE names, or "default".
// An explicitly named profile must exist; "default" may be absent. What is still missing is
// named in the error, with the ways to give it.
func resolveConfig(in configInputs, getenv func(string) string, path string) (config, error) {
	var layers []profile
	if in.urlSet || in.keySet {
		layers = append(layers, profile{url: in.url, apiKey: in.apiKey})
	}
	load := func(name string, must bool) error {
		profiles, err := readProfiles(path)
		if err != nil && (must || !errors.Is(err, fs.ErrNotExist)) {
			return err
		}
		p, ok := profiles[name]
		if !ok && must {
			return fmt.Errorf("profile %q: no [%s] section in %s", name, name, path)
		}
		layers = append(layers, p)
		return nil
	}
	if in.profileSet {
		if err := load(in.profile, true); err != nil {
			return config{}, err
		}
	}
	layers = append(layers, profile{url: getenv("WB_URL"), apiKey: getenv("WB_API_KEY")})
	if !in.profileSet {
		name, must := getenv("WB_PROFILE"), true
		if name == "" {
			name, must = "default", false
		}
		if err := load(name, must); err != nil {
			return config{}, err
		}
	}
	var c config
	urlFound, keyFound := false, false
	for i, l := range layers {
		explicit := i == 0 && (in.urlSet || in.keySet)
		if !urlFound && (l.url != "" || (explicit && in.urlSet)) {
			c.url, urlFound = l.url, true
		}
		if !keyFound && (l.apiKey != "" || (explicit && in.keySet)) {
			c.apiKey, keyFound = l.apiKey, true
		}
	}
	var missing []string
	if c.url == "" {
		missing = append(missing, "the API URL (--url, WB_URL, or url = … in a profile)")
	}
	if c.apiKey == "" {
		missing = append(missing, "the API key (--api-key, WB_API_KEY, or api_key = … in a profile)")
	}
	if len(missing) > 0 {
		return config{}, fmt.Errorf("missing %s; the profile file is %s", strings.Join(missing, " and "), path)
	}
	return c, nil
}

// readProfiles parses the profile file: [name] sections of url = … and api_key = … lines;
// blank lines and # or ; comments are skipped.
func readProfiles(path string) (map[string]profile, error) {
	if path == "" {
		return nil, fmt.Errorf("no profile file: set WB_CONFIG, or HOME (USERPROFILE on Windows): %w", fs.ErrNotExist)
	}
	f, err := os.Open(path)
	if err != nil {
		return nil, fmt.Errorf("profile file: %w", err)
	}
	defer f.Close()
	out := map[string]profile{}
	section := ""
	sc := bufio.NewScanner(f)
	for n := 1; sc.Scan(); n++ {
		line := strings.TrimSpace(sc.Text())
		switch {
		case line == "" || strings.HasPrefix(line, "#") || strings.HasPrefix(line, ";"):
			continue
		case strings.HasPrefix(line, "[") && strings.HasSuffix(line, "]"):
			section = strings.TrimSpace(line[1 : len(line)-1])
			if section == "" {
				return nil, fmt.Errorf("%s:%d: an empty [] section name", path, n)
			}
			out[section] = out[section]
			continue
		}
		k, v, ok := strings.Cut(line, "=")
		if !ok {
			return nil, fmt.Errorf("%s:%d: want key = value or [profile], got %q", path, n, line)
		}
		if section == "" {
			return nil, fmt.Errorf("%s:%d: %q comes before any [profile] section", path, n, line)
		}
		k, v = strings.TrimSpace(k), strings.Trim(strings.TrimSpace(v), `"'`)
		p := out[section]
		switch k {
		case "url":
			p.url = v
		case "api_key":
			p.apiKey = v
		default:
			return nil, fmt.Errorf("%s:%d: unknown key %q: want url or api_key", path, n, k)
		}
		out[section] = p
	}
	if err := sc.Err(); err != nil {
		return nil, fmt.Errorf("profile file %s: %w", path, err)
	}
	return out, nil
}

// profileNames lists the profile file's sections, for completion.
func profileNames(path string) ([]string, error) {
	profiles, err := readProfiles(path)
	if err != nil {
		return nil, err
	}
	var names []string
	for n := range profiles {
		names = append(names, n)
	}
	return names, nil
}
