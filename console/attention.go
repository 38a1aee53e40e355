package console

import (
	"fmt"
	"net/http"
	"strconv"
	"strings"
	"time"

	"google.golang.org/protobuf/types/known/timestamppb"

	pb "github.com/jobfence/jobfence/gen/jobfence/v1"
)

// attention lists the jobs on the attention list (R34), longest listed
// first, one keyset page at a time: a receipt that came after the job
// succeeded, a cancel that came too late. Each stays until a person
// acknowledges it with a note.
func (c *Console) attention(w http.ResponseWriter, r *http.Request, s *session) {
	c.listPage(w, r, s, "attention", "Attention list", &pb.ListJobsRequest{Attention: true, PageSize: pageSize,
		PageToken: r.URL.Query().Get("page")}, listView{})
}

// acknowledge takes a job off the attention list with the person's note,
// fenced by the attention_since their page showed: a newer reason to look,
// come since, keeps it listed.
func (c *Console) acknowledge(w http.ResponseWriter, r *http.Request, s *session) {
	id, err := strconv.ParseInt(r.PathValue("id"), 10, 64)
	if err != nil || id <= 0 {
		c.fail(w, r, s, http.StatusNotFound, "No such job.")
		return
	}
	back := "/jobs/" + strconv.FormatInt(id, 10)
	if r.PostFormValue("back") == "attention" {
		back = "/attention"
	}
	since, err := time.Parse(time.RFC3339Nano, r.PostFormValue("attention_since"))
	if err != nil {
		c.fail(w, r, s, http.StatusBadRequest, "The form does not say since when the job is listed: open it again.")
		return
	}
	note, ok := c.note(w, r, s, "note", back)
	if !ok {
		return
	}
	ctx, cancel := c.call(r, s.token)
	defer cancel()
	resp, err := c.api.AcknowledgeAttention(ctx, &pb.AcknowledgeAttentionRequest{JobId: id,
		AttentionSince: timestamppb.New(since), Note: note})
	c.log.Info("console: acknowledge", "operator", s.name, "job_id", id, "ok", err == nil)
	done := fmt.Sprintf("Acknowledged: job %d is off the attention list; your note is in its history under %s.", id, s.name)
	if resp.GetReplayed() {
		done = "This acknowledgement had already been recorded; nothing new was written."
	}
	c.report(w, r, s, back, err, done, fmt.Sprintf("A newer reason to look at job %d came in since your page "+
		"showed it: it stays on the attention list. Nothing was changed by you; read it again.", id))
}

// attentionCauses are the kinds of attention_reason, in a person's words.
var attentionCauses = map[string]string{
	"cancel_too_late": "A cancel came too late: the provider had already made the refund, which stands.",
	"receipt_after_success": "A receipt came after the refund succeeded: the provider reported it failed, or " +
		"another refund id. Check the provider: the customer may not have been refunded, or refunded twice.",
	"receipt_after_cancel": "A receipt came after the refund was cancelled: the provider reported it made or " +
		"pending. Check the provider: money may have moved.",
}

// attentionWords is why a job is on the attention list, as a person reads
// it: the cause of its reason ("cancel_too_late: …") in words, then the
// rest as the coordinator wrote it.
func attentionWords(reason string) string {
	cause, rest, _ := strings.Cut(reason, ":")
	words, ok := attentionCauses[strings.TrimSpace(cause)]
	if !ok {
		return plain(reason)
	}
	if rest = plain(rest); rest != "" {
		return words + " (" + rest + ")"
	}
	return words
}
