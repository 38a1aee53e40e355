package console

import (
	"net/http"
	"strings"

	pb "github.com/jobfence/jobfence/gen/jobfence/v1"
)

// providersBack is where pausing and resuming return: the overview's
// providers.
const providersBack = "/#providers"

// pause stops the grants of a provider's jobs on every coordinator (R33),
// with the person's reason; the first pause of a paused provider stands.
func (c *Console) pause(w http.ResponseWriter, r *http.Request, s *session) {
	provider := strings.TrimSpace(r.PostFormValue("provider"))
	reason, ok := c.note(w, r, s, "reason", providersBack)
	if !ok {
		return
	}
	ctx, cancel := c.call(r, s.token)
	defer cancel()
	resp, err := c.api.PauseProvider(ctx, &pb.PauseProviderRequest{Provider: provider, Reason: reason})
	c.log.Info("console: pause", "operator", s.name, "provider", provider, "ok", err == nil, "changed", resp.GetChanged())
	done := provider + " is paused: no coordinator grants its jobs from its next poll on, reconciles included; " +
		"jobs running now finish as usual. Recorded under " + s.name + ". (The overview is kept for two " +
		"seconds: the list below may show it a moment later.)"
	if p := resp.GetPause(); !resp.GetChanged() {
		done = provider + " was already paused, by " + p.GetPausedBy() + " at " + formatTime(p.GetPausedAt()) +
			": that pause stands. Nothing was changed."
	}
	c.report(w, r, s, providersBack, err, done, "")
}

// resume lets a paused provider's jobs be granted again.
func (c *Console) resume(w http.ResponseWriter, r *http.Request, s *session) {
	provider := strings.TrimSpace(r.PostFormValue("provider"))
	reason, ok := c.note(w, r, s, "reason", providersBack)
	if !ok {
		return
	}
	ctx, cancel := c.call(r, s.token)
	defer cancel()
	resp, err := c.api.ResumeProvider(ctx, &pb.ResumeProviderRequest{Provider: provider, Reason: reason})
	c.log.Info("console: resume", "operator", s.name, "provider", provider, "ok", err == nil, "changed", resp.GetChanged())
	done := provider + " is resumed: its jobs are granted again. Recorded under " + s.name + ". (The overview " +
		"is kept for two seconds: the list below may show it a moment later.)"
	if !resp.GetChanged() {
		done = provider + " was not paused. Nothing was changed."
	}
	c.report(w, r, s, providersBack, err, done, "")
}
