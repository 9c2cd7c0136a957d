package admin

import (
	"fmt"
	"net/url"
	"slices"
	"strconv"
	"strings"
)

// Lease and advisory lock states a view can be filtered by.
var (
	leaseStates = []string{"held", "expired", "lock-delay", "free", "all"}
	lockStates  = []string{"", "held", "waiting", "contended"}
	// refreshSeconds are the auto-refresh intervals the page offers; 0 is off.
	refreshSeconds = []int{0, 5, 15, 60}
)

const (
	maxFilterLen = 1024
	maxOffset    = 1_000_000
)

// filter is what a view of the page shows, all of it in the URL's query so
// that a view can be bookmarked, refreshed and returned to after a release:
//
//	q        name prefix (leases, advisory lock names, waiters, job names)
//	holder   substring of the lease owner, the advisory holder's
//	         application name or its backend pid, or a lease waiter's
//	         owner or id
//	state    leases: held (default), expired, free or all
//	locks    advisory locks: all (default), held, waiting or contended
//	after    leases after this name (the next page)
//	offset   advisory locks to skip (the next page)
//	refresh  reload the page every N seconds (5, 15 or 60)
type filter struct {
	Prefix, Holder, State, Locks, After string
	Offset, Refresh                     int
}

// parseFilter reads a filter from a query, refusing values the page never
// links to.
func parseFilter(q url.Values) (filter, error) {
	f := filter{Prefix: q.Get("q"), Holder: q.Get("holder"), State: q.Get("state"), Locks: q.Get("locks"), After: q.Get("after")}
	if f.State == "" {
		f.State = "held"
	}
	for name, v := range map[string]string{"q": f.Prefix, "holder": f.Holder, "after": f.After} {
		if len(v) > maxFilterLen {
			return f, fmt.Errorf("%s is longer than %d bytes", name, maxFilterLen)
		}
	}
	if !slices.Contains(leaseStates, f.State) {
		return f, fmt.Errorf("state must be one of %s", strings.Join(leaseStates, ", "))
	}
	if !slices.Contains(lockStates, f.Locks) {
		return f, fmt.Errorf("locks must be empty or one of %s", strings.Join(lockStates[1:], ", "))
	}
	var err error
	if v := q.Get("offset"); v != "" {
		if f.Offset, err = strconv.Atoi(v); err != nil || f.Offset < 0 || f.Offset > maxOffset {
			return f, fmt.Errorf("offset must be a number from 0 to %d", maxOffset)
		}
	}
	if v := q.Get("refresh"); v != "" {
		if f.Refresh, err = strconv.Atoi(v); err != nil || !slices.Contains(refreshSeconds, f.Refresh) {
			return f, fmt.Errorf("refresh must be one of %v seconds", refreshSeconds[1:])
		}
	}
	return f, nil
}

// query encodes f, leaving out defaults, so that the page's links are short.
func (f filter) query() url.Values {
	q := url.Values{}
	set := func(k, v, def string) {
		if v != def {
			q.Set(k, v)
		}
	}
	set("q", f.Prefix, "")
	set("holder", f.Holder, "")
	set("state", f.State, "held")
	set("locks", f.Locks, "")
	set("after", f.After, "")
	set("offset", strconv.Itoa(f.Offset), "0")
	set("refresh", strconv.Itoa(f.Refresh), "0")
	return q
}

// URL is the page's relative URL for f: the page is served at the folder
// it is mounted at, so "./" works under any prefix.
func (f filter) URL() string {
	if q := f.query().Encode(); q != "" {
		return "./?" + q
	}
	return "./"
}

// Query is f's query string without "?", for the release forms to return
// to the same view.
func (f filter) Query() string { return f.query().Encode() }

// with returns the URL of f changed by change.
func (f filter) with(change func(*filter)) string {
	change(&f)
	return f.URL()
}

func (f filter) refreshLinks() []refreshLink {
	links := make([]refreshLink, 0, len(refreshSeconds))
	for _, sec := range refreshSeconds {
		label := "off"
		if sec > 0 {
			label = strconv.Itoa(sec) + "s"
		}
		links = append(links, refreshLink{Label: label, URL: f.with(func(n *filter) { n.Refresh = sec }), Current: f.Refresh == sec})
	}
	return links
}

// returnURL is where a POST redirects to: the view named by the form's
// "return" field (a query string), or the default view. Only the filter's
// own keys survive, so it can never redirect anywhere but to the page.
func returnURL(form url.Values) string {
	f, err := parseQueryFilter(form.Get("return"))
	if err != nil {
		return "./"
	}
	return f.URL()
}

func parseQueryFilter(query string) (filter, error) {
	q, err := url.ParseQuery(query)
	if err != nil {
		return filter{}, err
	}
	return parseFilter(q)
}
