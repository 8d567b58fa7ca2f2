# attacks: json.marshal of a small shared structure (built by comprehensions) whose text is 16^7 times larger
# expect: deny
package wb.admission

a0 := ["0123456789abcdef", "0123456789abcdef"]

a1 := [a0 | some _ in numbers.range(1, 16)]

a2 := [a1 | some _ in numbers.range(1, 16)]

a3 := [a2 | some _ in numbers.range(1, 16)]

a4 := [a3 | some _ in numbers.range(1, 16)]

a5 := [a4 | some _ in numbers.range(1, 16)]

a6 := [a5 | some _ in numbers.range(1, 16)]

a7 := [a6 | some _ in numbers.range(1, 16)]

deny contains "never" if count(json.marshal(a7)) < 0
