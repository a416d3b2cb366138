"""A flat-form CSV whose bad rows follow quoted fields holding line breaks, and a blank line: for the tests of the
lines named for rejected rows (the line where each starts in an editor)."""

# its lines, {eol} standing for the line end inside quoted fields (LF, CRLF or a lone CR)
MULTI_LINE_CSV = ["request_id,step,position,draft_token,accepted", '"req{eol}uest{eol}-1",0,1,5,true', "",
                  "r,1,1,5,true,extra", '"a{eol}b",2,1,5,true', "r,3,1,5,maybe", "r,3,2,5,false",
                  '"c{eol}d",4,1,5,true', "r,5,1,5,3"]
# (line, field, step): line 6 has a cell too many, line 10 is of the same step as line 9
MULTI_LINE_REJECTED = [(6, "", 1), (9, "accepted", 3), (10, "", 3), (13, "accepted", 5)]
