# attacks: json.unmarshal of a huge JSON array built by doubling a string
# expect: deny
package wb.admission

e0 := "[1,2,3,4,5,6,7,8]"

e1 := concat(",", [e0, e0, e0, e0, e0, e0, e0, e0, e0, e0, e0, e0, e0, e0, e0, e0])

e2 := concat(",", [e1, e1, e1, e1, e1, e1, e1, e1, e1, e1, e1, e1, e1, e1, e1, e1])

e3 := concat(",", [e2, e2, e2, e2, e2, e2, e2, e2, e2, e2, e2, e2, e2, e2, e2, e2])

e4 := concat(",", [e3, e3, e3, e3, e3, e3, e3, e3, e3, e3, e3, e3, e3, e3, e3, e3])

e5 := concat(",", [e4, e4, e4, e4, e4, e4, e4, e4, e4, e4, e4, e4, e4, e4, e4, e4])

e6 := concat(",", [e5, e5, e5, e5, e5, e5, e5, e5, e5, e5, e5, e5, e5, e5, e5, e5])

doc := json.unmarshal(concat("", ["[", e6, "]"]))

deny contains "never" if count(doc) < 0
