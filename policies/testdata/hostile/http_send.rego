# attacks: http.send to the cloud metadata endpoint from inside the control plane
# expect: compile_error
package wb.admission

deny contains msg if {
	r := http.send({"method": "get", "url": "http://169.254.169.254/latest/meta-data/"})
	msg := r.raw_body
}
