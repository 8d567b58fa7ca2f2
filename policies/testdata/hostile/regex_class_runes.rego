# attacks: regex.match with a pattern of 65,536 \pL classes (192 KiB) on an empty text: Go's parser expands each class to its 1,300 ranges, half a second and 200 MiB inside the work check itself
# expect: deny
package wb.admission

a0 := `\pL\pL\pL\pL\pL\pL\pL\pL\pL\pL\pL\pL\pL\pL\pL\pL`

a1 := concat("", [a0, a0, a0, a0, a0, a0, a0, a0, a0, a0, a0, a0, a0, a0, a0, a0])

a2 := concat("", [a1, a1, a1, a1, a1, a1, a1, a1, a1, a1, a1, a1, a1, a1, a1, a1])

pattern := concat("", [a2, a2, a2, a2, a2, a2, a2, a2, a2, a2, a2, a2, a2, a2, a2, a2])

deny contains "answered in time" if not regex.match(pattern, "")
